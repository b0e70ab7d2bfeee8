package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/backoff"
	"github.com/go-locker/locker/internal/pgrace"
	"github.com/go-locker/locker/internal/timerq"
)

// Defaults of the Locker options.
const (
	// DefaultHealthCheckInterval is how often a held lock's connection is
	// checked when WithHealthCheckInterval is not given.
	DefaultHealthCheckInterval = 5 * time.Second

	// DefaultSequence is the sequence that hands out fencing tokens when
	// WithSequence is not given. It is resolved through the search_path of
	// the pool's connections, like any unqualified name.
	DefaultSequence = "locker_fence"
)

// Time bounds of the work that protects against dead links; each takes a
// round trip or two on a live server.
const (
	// cancelRequestTimeout bounds delivering a cancel request.
	cancelRequestTimeout = 2 * time.Second
	// abandonWait bounds how long Acquire outstays its context to leave no
	// backend queued: past it the connection is closed instead.
	abandonWait = time.Second
	// cancelGrace bounds a cleanup statement, and how long a health check
	// may overrun its interval before its socket is closed under it.
	cancelGrace = time.Second
	// closeAbandon is how long Close lets a wait it interrupted, and then
	// the pool it owns, end politely (a cancel request, a Terminate message)
	// before it closes their sockets: long enough for a live server, short
	// enough that Close returns promptly on a dead link.
	closeAbandon = 200 * time.Millisecond
)

// ErrPoolExhausted reports that a lock could not be taken because every
// connection of the pool was in use until the caller's context ended. Each
// held lock pins one connection for as long as it is held.
var ErrPoolExhausted = errors.New("postgres: connection pool exhausted")

// ErrPooler reports a connection that does not keep one server session from
// statement to statement — a transaction-mode pooler (PgBouncer
// pool_mode=transaction, and the like) sits between the pool and PostgreSQL
// — or one that goes through a pooler or proxy that was not declared a
// session pooler with WithSessionPooler. Session advisory locks cannot work
// in transaction mode; use LockTx there, or connect directly or through a
// session-mode pooler.
var ErrPooler = errors.New("postgres: connection may not keep its server session (pooler)")

// Locker takes PostgreSQL session-level advisory locks. Each held lock pins
// one connection of the pool until it is released or lost. Build it with New
// or open it with locker.Open; it is safe for concurrent use.
type Locker struct {
	pool     *pgxpool.Pool
	ownsPool bool
	cfg      config

	// life admits the calls, ties their contexts to Close, counts the
	// calls and goroutines in flight (health monitors, the clean-ups of
	// abandoned waits) and keeps the held handles for Close.
	life *backend.Life[*handle]

	// sockets tracks the sockets of a pool the Locker opened (nil for a
	// caller's pool), so that Close can end them on a dead link.
	sockets *sockets

	seqMu    sync.Mutex
	seqReady atomic.Bool // read without seqMu on every acquisition

	// monitorQ starts health monitors right after their grant, and
	// backstopQ closes the socket of a wait slice that got no answer: one
	// runtime timer each for the whole Locker, since an acquisition that
	// arms a timer of its own pays a wake-up of the network poller.
	monitorQ  *timerq.Queue
	backstopQ *timerq.Queue
	// releaseQ bounds each unlock by locker.ReleaseTimeout (see unlock).
	releaseQ *timerq.Queue

	// intervalTimeout is the lock_timeout of a wait's usual slice (see
	// sliceTimeout), defaultIdle the idle_session_timeout of the default
	// TTL (see termsFor): strings made once, not at every acquisition.
	intervalTimeout, defaultIdle string
}

var _ locker.Locker = (*Locker)(nil)

// config is the shared settings (backend.Settings; postgres honours the
// default TTL, the drift margin, the prefix and WithoutDDL) and this
// package's own.
type config struct {
	backend.Settings
	interval  time.Duration
	sequence  string
	sessionOK bool  // WithSessionPooler
	err       error // the first invalid option, reported by every call
}

// Option configures a Locker. WithDefaultTTL, WithDriftMargin, WithPrefix,
// WithoutDDL and WithTokenBase are the names every backend gives these
// settings (see backend.Settings); the others are this package's own.
type Option func(*config) error

// WithPrefix keeps this Locker's keys apart from those of Lockers with
// another prefix on the same database (URL parameter prefix): the prefix
// is hashed together with each key (see AdvisoryKey). Lockers that must
// exclude each other need the same prefix. The default is the empty
// prefix.
func WithPrefix(prefix string) Option {
	return func(c *config) error { return c.set(backend.SetPrefix(prefix)) }
}

// set applies a shared setting, naming the package in its error.
func (c *config) set(s backend.Setting) error {
	if err := s(&c.Settings); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	return nil
}

// WithDefaultTTL sets the TTL of the Locker's locks taken without a
// per-call locker.WithTTL (default locker.DefaultTTL, within
// [locker.MinTTL, locker.MaxTTL] like every TTL; URL parameter ttl): how
// long the server keeps a lock whose holder went silent (see the package
// documentation).
func WithDefaultTTL(ttl time.Duration) Option {
	return func(c *config) error { return c.set(backend.SetDefaultTTL(ttl)) }
}

// WithDriftMargin sets how long before the server may end a silent
// holder's session the holder gives its lock up as lost (URL parameter
// drift_margin). The lease is counted on the holder's monotonic clock from
// the moment the last statement the server answered was sent, so network
// delay is already on the safe side; the margin covers the two clocks
// running at slightly different rates and the holder's own stalls. The
// default is TTL/50 + 100ms, at most TTL/4; it must be below half the TTL
// of every lock.
func WithDriftMargin(d time.Duration) Option {
	return func(c *config) error { return c.set(backend.SetDriftMargin(d)) }
}

// WithLogger sets where the Locker logs its events (no URL form): a lock
// at risk (a health check slow to answer) and cleared, a lock lost and
// why. Nil, the default, logs nothing. Keys are shown as errors show them;
// passwords never.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { return c.set(backend.SetLogger(l)) }
}

// WithHealthCheckInterval sets how often each held lock's connection is
// checked (default 5s), at most: a lock is checked at least every third of
// its TTL. A check that fails, or does not answer within one interval (or
// before the lease runs out, less the drift margin, if that comes first),
// ends the lock with ErrLost and closes its connection. A connection that
// the server closes (pg_terminate_backend, restart, reset, its
// idle_session_timeout) is noticed at once, without waiting for a check. It
// is also the length of each slice of a waiting Acquire (see Acquire). The
// interval must be positive.
func WithHealthCheckInterval(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: health-check interval must be positive, got %v", locker.ErrInvalidOption, d)
		}
		c.interval = d
		return nil
	}
}

// WithSequence names the sequence that hands out fencing tokens (default
// locker_fence), as SQL would write it: optionally schema-qualified, each
// part a plain identifier (folded to lower case) or a double-quoted one.
// Every Locker that locks the same keys must use the same sequence, or
// tokens are not ordered between them.
func WithSequence(name string) Option {
	return func(c *config) error {
		if !sequenceName.MatchString(name) {
			return fmt.Errorf("%w: sequence name %q is not a possibly schema-qualified SQL identifier", locker.ErrInvalidOption, name)
		}
		c.sequence = name
		return nil
	}
}

// WithoutDDL stops the Locker from creating the token sequence when it is
// missing (URL: ddl=false); an acquisition then fails with an error that
// shows the SQL to run. Use it where the application's role may not run
// DDL.
func WithoutDDL() Option {
	return func(c *config) error { return c.set(backend.SetNoDDL()) }
}

// WithTokenBase adds n to every token the Locker hands out (URL parameter
// token_base): Handle.Token and the token of LockTx and TryLockTx are n
// plus the value drawn from the sequence. n must be within [0,
// locker.MaxTokenBase]; give every Locker of a deployment the same n, as
// the same prefix and sequence (see locker.MaxTokenBase, and README's
// "Changing backends" for when to set it).
func WithTokenBase(n int64) Option {
	return func(c *config) error { return c.set(backend.SetTokenBase(n)) }
}

// WithSessionPooler declares that the pool's connections go through a
// pooler or proxy in session mode (PgBouncer pool_mode=session, and the
// like), which ties each client connection to one server session for its
// whole life. Without it the Locker refuses, with ErrPooler, a connection
// whose server backend differs from the one it announced at connect time —
// the mark of a pooler or proxy — because in transaction mode a session lock
// would not really be held, and another client could be granted it too.
// With it the Locker still checks, after each grant and at every health
// check, that statements keep landing on the backend that holds the lock.
func WithSessionPooler() Option {
	return func(c *config) error {
		c.sessionOK = true
		return nil
	}
}

func (c *config) setErr(err error) {
	if c.err == nil {
		c.err = err
	}
}

// sequenceName accepts [schema.]name where each part is an unquoted or a
// double-quoted identifier. Nothing else can appear, which is what makes it
// safe to put the name into the CREATE SEQUENCE statement.
var sequenceName = regexp.MustCompile(`^(?:(?:[A-Za-z_][A-Za-z0-9_$]*|"(?:[^"\x00]|"")+")\.)?(?:[A-Za-z_][A-Za-z0-9_$]*|"(?:[^"\x00]|"")+")$`)

// New returns a Locker that takes its connections from pool. The Locker does
// not own the pool: Close releases the locks but leaves the pool open, and
// the pool must outlive the Locker (pgxpool.Pool.Close waits for the
// connections that held locks pin).
//
// An invalid option is reported, wrapping locker.ErrInvalidOption, by every
// Acquire and TryAcquire.
func New(pool *pgxpool.Pool, opts ...Option) *Locker {
	cfg := newConfig(opts)
	if pool == nil {
		cfg.setErr(fmt.Errorf("%w: nil *pgxpool.Pool", locker.ErrInvalidOption))
	}
	return &Locker{
		pool:      pool,
		cfg:       cfg,
		life:      backend.NewLife[*handle](cfg.err),
		monitorQ:  timerq.New(monitorDelay),
		backstopQ: timerq.New(2 * cfg.interval),
		releaseQ:  timerq.New(locker.ReleaseTimeout),

		intervalTimeout: lockTimeout(cfg.interval),
		defaultIdle:     millis(cfg.defaultTTL().Truncate(time.Millisecond)),
	}
}

// Err returns the error of an invalid option or a nil pool given to New
// (wrapping locker.ErrInvalidOption), which every Acquire and TryAcquire
// also returns, or nil: a way to fail at start-up rather than at the first
// lock. It does not contact the server.
func (l *Locker) Err() error { return l.cfg.err }

// defaultTTL is the TTL of a lock taken without locker.WithTTL.
func (c *config) defaultTTL() time.Duration {
	if c.TTL > 0 {
		return c.TTL
	}
	return locker.DefaultTTL
}

// newConfig applies opts to the defaults; cfg.err holds every invalid one.
func newConfig(opts []Option) config {
	cfg := config{interval: DefaultHealthCheckInterval, sequence: DefaultSequence}
	cfg.err = backend.Apply(&cfg, opts)
	if cfg.err == nil {
		// A drift margin too long for the default TTL fails at once; one
		// too long for a per-call TTL, that call.
		_, cfg.err = limits.Drift("drift margin", cfg.DriftMargin, cfg.defaultTTL())
	}
	return cfg
}

// AdvisoryKey returns the bigint advisory-lock key that namespace and key map
// to: the first 8 bytes, big-endian, of
//
//	SHA-256("locker/v1\x00" || uint64be(len(namespace)) || namespace || key)
//
// read as a two's-complement int64. The length prefix makes (namespace, key)
// pairs encode injectively before hashing; the hash makes any key of up to
// locker.MaxKeyLen bytes fit the 64-bit key space. Two distinct keys share an
// advisory key only by a hash collision (about one chance in 2^64 per pair),
// which costs false contention — the keys exclude each other — and never a
// double grant. Programs in other languages can compute the same value to
// take part in the same locks, or to find a lock in pg_locks (classid holds
// the high 32 bits, objid the low 32, objsubid is 1). In SQL:
//
//	SELECT ('x' || left(encode(sha256('locker/v1'::bytea || '\x00'::bytea
//	        || int8send(octet_length(convert_to(ns, 'UTF8')))
//	        || convert_to(ns, 'UTF8') || convert_to(key, 'UTF8')), 'hex'), 16))::bit(64)::bigint
func AdvisoryKey(namespace, key string) int64 { return advisoryKey("locker/v1", namespace, key) }

// advisoryKey is AdvisoryKey with another domain in place of "locker/v1"
// (see famKey): distinct domains, which contain no NUL, hash distinct
// inputs.
func advisoryKey(domain, namespace, key string) int64 {
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(namespace)))
	h.Write([]byte(domain))
	h.Write([]byte{0})
	h.Write(n[:])
	h.Write([]byte(namespace))
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	return int64(binary.BigEndian.Uint64(h.Sum(sum[:0])[:8]))
}

// Acquire waits until key is held. The wait happens in PostgreSQL
// (pg_advisory_lock): waiters queue on the server, and the next one is granted
// the instant the holder unlocks. When ctx ends first, a cancel request stops
// the server-side wait, and a lock granted in that same instant is given back.
// The lock's TTL (locker.WithTTL, else the Locker's default) is how long the
// server keeps it once its holder went silent (see the package
// documentation and Handle.TTL).
//
// The wait goes in slices of one health-check interval (or a third of the
// TTL, if that is shorter), each ended by the server (a lock_timeout for
// that statement only), after which Acquire waits again at the back of the
// server's queue; so does a statement_timeout or lock_timeout of the
// session: neither ends Acquire before ctx does. When the server does not
// answer a slice within one more slice, the link is taken for dead: the
// connection is closed, and Acquire fails.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return l.acquire(ctx, "acquire", key, true, opts)
}

// TryAcquire makes one attempt (pg_try_advisory_lock); when another session
// holds key the error wraps locker.ErrNotAcquired. It does not wait for the
// holder, but it does wait, as long as ctx allows, for a free connection of
// the pool (then failing with ErrPoolExhausted): give it a deadline where it
// must not block.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return l.acquire(ctx, "try-acquire", key, false, opts)
}

func (l *Locker) acquire(ctx context.Context, op, key string, wait bool, opts []locker.Option) (locker.Handle, error) {
	desc := backend.Owner(opts)
	return l.acquireWith(ctx, op, key, opts, func(ctx context.Context, conn *pgxpool.Conn, t terms) (grant, error) {
		id := AdvisoryKey(l.cfg.Prefix, key)
		t = t.withOwner(desc)
		if wait {
			return l.lockWait(ctx, conn, id, t)
		}
		return l.lockTry(ctx, conn, id, t)
	})
}

// lockFunc takes a lock on conn, a connection of the pool pinned for it,
// with the lease t: on success conn stays pinned to the lock; on every
// other outcome it has been given back to the pool or destroyed.
type lockFunc func(ctx context.Context, conn *pgxpool.Conn, t terms) (grant, error)

// acquireWith is what every acquisition of every lock family does around
// lock: the options, the Locker's life, the lease, the token sequence, a
// pinned connection, the token base, the handle and its health monitor.
func (l *Locker) acquireWith(ctx context.Context, op, key string, opts []locker.Option, lock lockFunc) (_ locker.Handle, err error) {
	o, err := backend.ApplyOptions(opts...)
	if err != nil {
		return nil, backend.KeyError(op, key, err)
	}
	ctx, done, err := l.life.Enter(ctx, op, key)
	if err != nil {
		return nil, err
	}
	defer done()
	defer func() { err = l.why(ctx, op, key, err) }()

	ttl := l.ttlOf(o)
	if _, err := limits.Drift("drift margin", l.cfg.DriftMargin, ttl); err != nil {
		return nil, backend.KeyError(op, key, err)
	}
	if err := l.ensureSequence(ctx); err != nil {
		return nil, backend.KeyError(op, key, err)
	}
	conn, err := l.acquireConn(ctx)
	if err != nil {
		return nil, backend.KeyError(op, key, err)
	}
	t, err := l.termsFor(ttl, serverMajor(conn.Conn().PgConn()))
	if err != nil {
		conn.Release()
		return nil, backend.KeyError(op, key, err)
	}
	if l.cfg.sessionOK {
		if err := checkSessionClean(ctx, conn); err != nil {
			destroy(conn)
			return nil, backend.KeyError(op, key, err)
		}
	}
	g, err := lock(ctx, conn, t)
	if err != nil {
		return nil, backend.KeyError(op, key, err)
	}
	if g.token, err = l.cfg.Token(g.token); err != nil {
		destroy(conn) // frees the lock; a sequence beyond 2^62 (see doc.go)
		return nil, backend.KeyError(op, key, err)
	}
	h := newHandle(l, conn, key, g)
	// The monitor is scheduled before the handle is held, so that a Close
	// that releases it at once finds a monitor to stop.
	h.scheduleMonitor()
	if !l.life.Hold(h) {
		// Close began while the lock was being granted: give it back.
		rctx, cancel := context.WithTimeout(context.Background(), locker.ReleaseTimeout)
		defer cancel()
		_ = h.release(rctx, true)
		return nil, backend.KeyError(op, key, locker.ErrClosed)
	}
	return h, nil
}

// ctxErr is the error of a call whose context (from Life.Enter) has ended:
// locker.ErrClosed when Close ended it, else the caller's context error with
// its cause (backend.ContextError).
func (l *Locker) ctxErr(ctx context.Context) error { return l.life.Why(ctx, ctx.Err()) }

// why makes sure that the error of a call whose context ended says why
// (see ctxErr): a call that Close interrupted fails with locker.ErrClosed
// only (quoting what it was doing), and one whose caller gave up wraps
// both the context's error and its cause, keeping what err wraps too (such
// as ErrPoolExhausted).
func (l *Locker) why(ctx context.Context, op, key string, err error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	why := l.ctxErr(ctx)
	closed := errors.Is(why, locker.ErrClosed)
	switch {
	case closed && errors.Is(err, locker.ErrClosed):
		return err
	case !closed && errors.Is(err, ctx.Err()) && errors.Is(err, context.Cause(ctx)):
		return err
	}
	// err already names op and key: quote only its cause.
	var ke *locker.Error
	if errors.As(err, &ke) {
		err = ke.Err
	}
	if closed {
		return backend.KeyError(op, key, fmt.Errorf("%w (while: %v)", why, err))
	}
	return backend.KeyError(op, key, fmt.Errorf("%w (while: %w)", why, err))
}

// acquireConn takes a connection to pin for one lock. When ctx ends while
// every connection is in use, the error says so: the usual cause is more
// locks held at once than the pool has connections.
func (l *Locker) acquireConn(ctx context.Context) (*pgxpool.Conn, error) {
	conn, err := l.pool.Acquire(ctx)
	if err == nil {
		return conn, nil
	}
	if ctx.Err() != nil {
		st := l.pool.Stat()
		if st.AcquiredConns() >= st.MaxConns() {
			return nil, fmt.Errorf("%w: all %d connections are in use (each held lock pins one; raise pool_max_conns or hold fewer locks at once): %w",
				ErrPoolExhausted, st.MaxConns(), l.ctxErr(ctx))
		}
		return nil, fmt.Errorf("waiting for a connection: %w", l.ctxErr(ctx))
	}
	return nil, fmt.Errorf("connecting: %w", err)
}

// ensureSequence makes sure the token sequence exists and hands out ordered
// values, once per Locker. It runs before any lock is taken so that a missing
// sequence can never fail a statement after its lock was granted.
func (l *Locker) ensureSequence(ctx context.Context) error {
	if l.seqReady.Load() {
		return nil
	}
	l.seqMu.Lock()
	defer l.seqMu.Unlock()
	if l.seqReady.Load() {
		return nil
	}
	seq := l.cfg.sequence
	for attempt := 0; ; attempt++ {
		var sp seqParams
		var usable bool
		var role string
		// nextval needs USAGE (or UPDATE) on the sequence: checked here,
		// so that a role without it is told what to grant before it locks
		// anything, not by a failed lock statement.
		err := l.pool.QueryRow(ctx,
			`SELECT s.seqcache, s.seqcycle, s.seqincrement, s.seqmin,
				pg_catalog.has_sequence_privilege(s.seqrelid, 'USAGE') OR pg_catalog.has_sequence_privilege(s.seqrelid, 'UPDATE'),
				current_user::text
			FROM pg_catalog.pg_sequence s WHERE s.seqrelid = pg_catalog.to_regclass($1)`,
			seq).Scan(&sp.cache, &sp.cycle, &sp.increment, &sp.min, &usable, &role)
		switch {
		case err == nil:
			if !usable {
				return fmt.Errorf("role %s may not use fencing-token sequence %s (nextval needs USAGE on it): GRANT USAGE ON SEQUENCE %s TO %s",
					quoteRole(role), seq, seq, quoteRole(role))
			}
			if err := sp.check(seq); err != nil {
				return err
			}
			l.seqReady.Store(true)
			return nil
		case !errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("checking fencing-token sequence %s: %w", seq, err)
		}
		if err := l.checkSearchPath(ctx, seq); err != nil {
			return err
		}
		// Another relation of that name? Only then is the name wrong. A
		// sequence that another session has just created may be found by
		// name (to_regclass reads the catalog as of now) while its
		// pg_sequence row is not in the statement's older snapshot: CI
		// found it so once, right after this Locker's CREATE lost the race
		// to another's, and took it for a table. The next statement sees
		// it.
		var kind string
		switch err := l.pool.QueryRow(ctx,
			`SELECT c.relkind::text FROM pg_catalog.pg_class c WHERE c.oid = pg_catalog.to_regclass($1)`, seq).Scan(&kind); {
		case err == nil && kind == "S" && attempt < maxSequenceAttempts:
			continue
		case err == nil && kind == "S":
			return fmt.Errorf("fencing-token sequence %s: found by name, but not in pg_sequence, %d times", seq, attempt+1)
		case err == nil:
			return fmt.Errorf("%s exists but is not a sequence (pg_class.relkind %q); name another with WithSequence", seq, kind)
		case !errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("checking fencing-token sequence %s: %w", seq, err)
		}
		switch {
		case l.cfg.NoDDL:
			return fmt.Errorf("fencing-token sequence %s does not exist (or is not visible in the search_path), and WithoutDDL forbids creating it; run: %s",
				seq, createSequenceSQL(seq))
		case attempt >= maxSequenceAttempts:
			return fmt.Errorf("fencing-token sequence %s: created %d times, and still not found in the search_path; check that the search_path's first schema is one this role may create in", seq, attempt)
		case attempt > 0:
			if !backoff.Sleep(ctx, time.Duration(attempt)*10*time.Millisecond) {
				return fmt.Errorf("creating fencing-token sequence %s: %w", seq, l.ctxErr(ctx))
			}
		}
		if _, err := l.pool.Exec(ctx, createSequenceSQL(seq)); err != nil && !pgrace.Lost(err) {
			return fmt.Errorf("creating fencing-token sequence: %w (if this role may not create it, create it once with a role that may, grant USAGE on it, and use WithoutDDL: %s)",
				err, createSequenceSQL(seq))
		}
	}
}

// maxSequenceAttempts bounds ensureSequence's CREATE SEQUENCE statements.
const maxSequenceAttempts = 5

// seqParams are the settings of a token sequence that decide whether its
// values can serve as tokens.
type seqParams struct {
	cache, increment, min int64
	cycle                 bool
}

// check refuses a sequence whose values could go down or be below 1:
//   - a cache: each session hands out numbers from its own block, so a later
//     holder could draw a lower token than an earlier one;
//   - a cycle: after the maximum the values start again from the minimum;
//   - a negative increment: every value is lower than the one before;
//   - a minimum below 1: tokens must be positive.
func (sp seqParams) check(seq string) error {
	var wrong, fix []string
	if sp.increment <= 0 {
		wrong = append(wrong, fmt.Sprintf("INCREMENT %d", sp.increment))
		fix = append(fix, "INCREMENT BY 1")
	}
	if sp.min < 1 {
		wrong = append(wrong, fmt.Sprintf("MINVALUE %d", sp.min))
		fix = append(fix, "MINVALUE 1")
	}
	if sp.cache != 1 {
		wrong = append(wrong, fmt.Sprintf("CACHE %d", sp.cache))
		fix = append(fix, "CACHE 1")
	}
	if sp.cycle {
		wrong = append(wrong, "CYCLE")
		fix = append(fix, "NO CYCLE")
	}
	if len(wrong) == 0 {
		return nil
	}
	return fmt.Errorf("fencing-token sequence %s has %s; tokens are positive and increase only with a positive INCREMENT, MINVALUE 1 or more, CACHE 1 and NO CYCLE: ALTER SEQUENCE %s %s (or name a new sequence with WithSequence)",
		seq, strings.Join(wrong, ", "), seq, strings.Join(fix, " "))
}

// checkSearchPath explains a sequence named without a schema that was not
// found because the role may use no schema of its search_path (it lacks
// USAGE on them): the sequence may well exist, and creating it would fail
// with "no schema has been selected to create in".
func (l *Locker) checkSearchPath(ctx context.Context, seq string) error {
	if qualified(seq) {
		return nil // to_regclass reports a schema the role may not use
	}
	var role, path string
	var none bool
	err := l.pool.QueryRow(ctx, `SELECT current_user::text, pg_catalog.current_setting('search_path'), pg_catalog.current_schema() IS NULL`).Scan(&role, &path, &none)
	if err != nil {
		return fmt.Errorf("checking fencing-token sequence %s: %w", seq, err)
	}
	if none {
		return fmt.Errorf("fencing-token sequence %s: role %s may use no schema of its search_path (%s), where the sequence is looked up: grant it USAGE on the sequence's schema (GRANT USAGE ON SCHEMA public TO %s), or name the sequence with its schema (WithSequence, lock_sequence)",
			seq, quoteRole(role), path, quoteRole(role))
	}
	return nil
}

// qualified reports whether a name that sequenceName accepts names its
// schema: a dot outside double quotes.
func qualified(name string) bool {
	quoted := false
	for _, r := range name {
		switch {
		case r == '"':
			quoted = !quoted
		case r == '.' && !quoted:
			return true
		}
	}
	return false
}

// quoteRole writes a role name as GRANT takes it.
func quoteRole(role string) string { return pgx.Identifier{role}.Sanitize() }

func createSequenceSQL(seq string) string {
	return "CREATE SEQUENCE IF NOT EXISTS " + seq + " AS bigint MINVALUE 1 NO CYCLE CACHE 1"
}

// Close releases every lock the Locker holds, ends the calls in flight
// with locker.ErrClosed (a wait on the server is first cancelled there) and
// stops the health checks. It closes the pool only when the Locker opened
// it (locker.Open). A lock whose unlock got no answer in time is not
// released: its connection is closed, the handle ends with an error
// wrapping locker.ErrLost and locker.ErrClosed, and Close returns an error
// for it (the server frees the lock when it sees the close).
//
// Close is bounded: it waits at most locker.ReleaseTimeout for the release
// of the held locks, then at most closeAbandon (200ms) for calls and
// goroutines in flight. Then it closes the sockets of the waits still on
// the server (a dead link) and waits at most 200ms more for what that ends;
// a pool it opened it closes, past 200ms by closing its sockets, and waits
// for the rest. Nothing of the Locker outlives Close, except, on a caller's
// pool, a statement whose pgx context-watcher handler (a custom
// BuildContextWatcherHandler) keeps it past its context on a dead link,
// until that handler gives up. A second Close returns nil.
func (l *Locker) Close() error {
	return l.life.Close(backend.Closer[*handle]{
		Release: releaseAll,
		Grace:   closeAbandon,
		Shutdown: func() error {
			if l.ownsPool {
				l.closePool()
			} else {
				l.life.Settle(closeAbandon)
			}
			return nil
		},
		// Once an opened pool's sockets are closed, everything in flight
		// ends at once.
		Wait: l.ownsPool,
	})
}

// releaseAll releases the handles Close found held, each bounded by
// locker.ReleaseTimeout, all at once.
func releaseAll(held []*handle) error {
	var wg sync.WaitGroup
	errs := make([]error, len(held))
	for i, h := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), locker.ReleaseTimeout)
			defer cancel()
			// Close reports the locks it could not release (they end with
			// ErrLost and ErrClosed), not those found lost already.
			if err := h.release(ctx, true); err != nil && errors.Is(h.state.Err(), locker.ErrLost) && errors.Is(h.state.Err(), locker.ErrClosed) {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// closePool closes the pool the Locker opened. pgxpool.Pool.Close waits for
// connections that pgx is still closing in the background — after an
// interrupted statement, with a cancel request on a new socket and a wait
// for the server to hang up, up to 15s each on a dead link — so past
// closeAbandon the Locker closes every socket of the pool under pgx.
func (l *Locker) closePool() {
	done := make(chan struct{})
	go func() {
		l.pool.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(closeAbandon):
		l.sockets.closeAll()
		<-done
	}
}
