package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// errNodeGone says a contender's own node vanished while it waited: its
// session expired, or someone deleted the node.
var errNodeGone = errors.New("zookeeper: the lock node vanished (session expired or node deleted)")

// Locker takes locks in one ZooKeeper ensemble. It is safe for concurrent
// use. Make one with Connect (it dials its own sessions) or New (on your
// connection).
//
// A lock's lease is the timeout of the session that owns its node, so a
// Locker has one session per lease in use (see sessions.go): its primary
// session (Connect: the default TTL's; New: your connection's), kept for
// its life, and one more per other lease asked, dialed on demand and
// closed once idle.
type Locker struct {
	cfg     config
	owns    bool     // Connect: Close closes the primary session's connection too
	servers []string // where the Locker dials sessions; nil: it dials none (New without WithServers)

	// life admits the calls, holds the handles, runs every goroutine of
	// the Locker and its Close. Its Closing ends every wait and the
	// goroutines that follow the sessions (the supervisors, the handles'
	// monitors, the shared watches); its Abandoned ends the go-zookeeper
	// calls still waited for (see call) and the clean-ups (removeNode,
	// sweepGhost).
	life *backend.Life[*Handle]

	smu      sync.Mutex
	sessions map[time.Duration]*session // by lease asked, and by lease granted (see learnGrant)
	primary  *session
	// floor and ceiling are the server's minSessionTimeout and
	// maxSessionTimeout as far as its grants showed them (0: not seen):
	// a lease below the floor or above the ceiling is the floor's or the
	// ceiling's session, with no session dialed for it.
	floor, ceiling time.Duration

	// checked is closed once New's check of the session timeout declared
	// against what the server grants is done, with checkErr its verdict
	// (closed at once for Connect).
	checked  chan struct{}
	checkErr error

	containers atomic.Bool // directories as container nodes (see createDir)
	noMulti    atomic.Bool // the server refused the create's multi: plain creates
	hot        hotKeys     // directories found contended lately: plain creates
}

var _ locker.Locker = (*Locker)(nil)

func newLocker(cfg config) *Locker {
	l := &Locker{cfg: cfg, sessions: make(map[time.Duration]*session), checked: make(chan struct{})}
	l.containers.Store(cfg.containers)
	return l
}

// Connect connects to the ensemble at servers ("host:port"; the port
// defaults to 2181) with a session of its own, whose timeout is the
// default TTL (WithDefaultTTL, else locker.DefaultTTL), waits until the
// session is established (and the WithAuth credentials added), and
// returns a Locker that owns its sessions: Close closes them. Locks of
// other TTLs get sessions of their own, dialed at their first Acquire
// (see the package documentation). ctx bounds the wait.
func Connect(ctx context.Context, servers []string, opts ...Option) (*Locker, error) {
	cfg := newConfig(opts)
	if cfg.err == nil && cfg.sessionTimeout != 0 {
		cfg.err = fmt.Errorf("zookeeper: Connect: %w: WithSessionTimeout is for New (the timeout you gave zk.Connect); Connect sizes its sessions from the TTLs: use WithDefaultTTL", locker.ErrInvalidOption)
	}
	if cfg.err == nil && cfg.servers != nil {
		cfg.err = fmt.Errorf("zookeeper: Connect: %w: WithServers is for New; Connect takes the servers as its argument", locker.ErrInvalidOption)
	}
	if cfg.err != nil {
		return nil, cfg.err
	}
	if len(servers) == 0 {
		return nil, fmt.Errorf("zookeeper: Connect: %w: no servers", locker.ErrInvalidOption)
	}
	addrs, err := checkServers(servers)
	if err != nil {
		return nil, fmt.Errorf("zookeeper: Connect: %w", err)
	}
	l := newLocker(cfg)
	l.owns, l.servers = true, addrs
	l.life = backend.NewLife[*Handle](nil)
	close(l.checked)
	l.smu.Lock()
	s, err := l.dialLocked(leaseStep(l.defaultTTL()), true)
	l.smu.Unlock()
	if err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("zookeeper: Connect: %w", err)
	}
	if _, _, err := s.awaitSession(ctx); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("zookeeper: connecting to %s: %w", strings.Join(addrs, ","), err)
	}
	return l, nil
}

// checkServers returns servers as host:port addresses, or an error wrapping
// locker.ErrInvalidOption.
func checkServers(servers []string) ([]string, error) {
	addrs := make([]string, len(servers))
	for i, s := range servers {
		a, err := withPort(s)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", locker.ErrInvalidOption, err)
		}
		addrs[i] = a
	}
	return addrs, nil
}

func withPort(s string) (string, error) { return backend.HostPort(s, "2181") }

// defaultTTL is the TTL of a lock taken without locker.WithTTL.
func (l *Locker) defaultTTL() time.Duration {
	if l.cfg.TTL != 0 {
		return l.cfg.TTL
	}
	return locker.DefaultTTL
}

// Conn returns the go-zookeeper connection of the Locker's primary
// session: the one of the default TTL (Connect), or yours (New).
func (l *Locker) Conn() *zk.Conn { return l.primary.conn }

// SessionTimeout returns the timeout of the Locker's primary session (see
// Conn): the one the server granted (Connect) or the one declared with
// WithSessionTimeout (New). It is the lease of the locks of that session.
// Zero before its first session. A lock's own lease is its Handle's TTL.
func (l *Locker) SessionTimeout() time.Duration { return l.primary.grantedTimeout() }

// Acquire waits until key is held, ctx ends, or the Locker is closed.
// Waiters are served in the order they arrived (the sequence of their
// nodes); each watches only the node before its own.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "acquire", key, mutexAsk, true, opts))
}

// TryAcquire takes key if nobody holds it or waits for it, and fails with an
// error wrapping locker.ErrNotAcquired otherwise, without waiting.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "try-acquire", key, mutexAsk, false, opts))
}

// acquire takes key's lock of the family and kind a asks for: a mutex, a
// read or write lock, or a permit.
func (l *Locker) acquire(ctx context.Context, op, key string, a ask, wait bool, opts []locker.Option) (*Handle, error) {
	// Close ends the call through cctx; Why tells the caller's context
	// from Close.
	cctx, done, err := l.life.Enter(ctx, op, key)
	if err != nil {
		return nil, err
	}
	defer done()
	o, err := backend.ApplyOptions(opts...)
	if err != nil {
		return nil, backend.KeyError(op, key, err)
	}
	if o.TTL == 0 {
		o.TTL = l.defaultTTL()
	}
	if a.kind == kindLock {
		a.desc = o.Owner
	}
	cwait := cctx
	if !wait {
		// One attempt waits for New's check as it would for a session.
		var c context.CancelFunc
		d := l.primary.attemptBound()
		cwait, c = context.WithTimeoutCause(cctx, d,
			fmt.Errorf("zookeeper: New's check of the session timeout with the server did not end within %v, which one attempt waits at most", d))
		defer c()
	}
	if err := l.awaitChecked(cwait); err != nil {
		if cctx.Err() == nil && cwait.Err() != nil {
			err = context.Cause(cwait)
		}
		return nil, backend.KeyError(op, key, l.life.Why(cctx, err))
	}
	s, release, err := l.sessionFor(o.TTL)
	if err != nil {
		return nil, backend.KeyError(op, key, l.life.Why(cctx, err))
	}
	defer release()

	for {
		swait := cctx
		if !wait {
			// One attempt: a disconnected session is waited for at most
			// one session timeout (the granted one, once known).
			var c context.CancelFunc
			d := s.attemptBound()
			swait, c = context.WithTimeoutCause(cctx, d,
				fmt.Errorf("none within the session timeout %v, which one attempt waits at most", d))
			defer c()
		}
		_, timeout, err := s.awaitSession(swait)
		if err != nil {
			if cctx.Err() == nil {
				// Not the caller's context: say why, without wrapping a
				// context error that would pass for the caller's.
				if swait.Err() != nil {
					err = context.Cause(swait)
				}
				err = fmt.Errorf("zookeeper: no session with the server: %w", err)
			}
			return nil, backend.KeyError(op, key, l.life.Why(cctx, err))
		}
		actx := cctx
		if !wait {
			// One attempt is bounded too: should the connection break in
			// the middle of it (a create whose answer is lost is looked
			// for once a session is back), it ends one session timeout
			// after it began, and cleans up after itself as an Acquire
			// whose context ended does.
			var c context.CancelFunc
			actx, c = context.WithTimeoutCause(cctx, timeout,
				fmt.Errorf("zookeeper: no answer from the server within the session timeout %v, which one attempt takes at most", timeout))
			defer c()
		}
		h, err := s.attempt(actx, key, a, wait)
		if err == nil {
			return h, nil
		}
		if wait && sessionEnded(err) && cctx.Err() == nil {
			continue // the session changed under us: start again
		}
		if cctx.Err() == nil && actx.Err() != nil && errors.Is(err, actx.Err()) {
			err = context.Cause(actx) // not the caller's context: say why
		}
		return nil, backend.KeyError(op, key, l.life.Why(cctx, err))
	}
}

// awaitChecked waits for New's check of the session timeout (see probe)
// and returns its verdict.
func (l *Locker) awaitChecked(ctx context.Context) error {
	select {
	case <-l.checked:
		return l.checkErr
	default:
	}
	select {
	case <-l.checked:
		return l.checkErr
	case <-ctx.Done():
		return backend.ContextError(ctx)
	}
}

// connGen returns the connection generation: a count of the session
// events the session has seen. A session the Locker dialed counts each one on
// go-zookeeper's own goroutine before go-zookeeper goes on (the callback
// runs inline), so before a new connection re-arms the old watches: a
// watch set at generation g whose event is read at generation g came on
// the connection it was set on, in transaction order with every other
// such watch. After a reconnect go-zookeeper sets the old watches again
// in no particular order, and the server fires those whose nodes changed
// meanwhile at once, in that order. New's own session counts the events as the
// supervisor reads them from the caller's channel, a little later (see
// the package documentation).
func (s *session) connGen() uint64 { return s.gen.Load() }

// attempt creates a node for key, in the directory of a's family, and
// contends with it.
func (s *session) attempt(ctx context.Context, key string, a ask, wait bool) (*Handle, error) {
	dir := a.dir(s.l.cfg.Prefix, key)
	c, err := s.createNode(ctx, dir, newGUID(), a)
	if err != nil {
		return nil, err
	}
	if c.dir != nil && c.dir.NumChildren > 1 {
		s.l.hot.mark(dir)
	}
	if c.dir != nil && c.dir.NumChildren == 1 {
		// The directory held nothing but our node right after its
		// create (one transaction): the lock is ours, with no read.
		h, err := s.hold(key, c.node, c.dir.Mzxid, c.sid)
		if err != nil {
			s.removeNode(c.node)
			return nil, err
		}
		h.setDup(c, dir)
		return h, nil
	}
	var h *Handle
	if a.kind == kindPermit {
		h, err = s.contendPermit(ctx, key, dir, c, a.limit, wait)
	} else {
		h, err = s.contend(ctx, key, dir, c, wait, a.kind == kindRead)
	}
	if err != nil {
		s.removeNode(c.node)
		return nil, err
	}
	h.setDup(c, dir)
	return h, nil
}

// sessionEnded reports an error after which the contender's node is gone
// with its session: the node vanished (errNodeGone), or a request was
// answered "session expired". go-zookeeper passes that on for a request
// the server processed after it had begun closing the expired session and
// before it closed the connection (a short window, but the answer is
// certain): nothing of the request was applied, and the session's nodes
// are deleted. A waiting Acquire starts over in the next session.
func sessionEnded(err error) bool {
	return errors.Is(err, errNodeGone) || errors.Is(err, zk.ErrSessionExpired)
}

// watchDelay is how long a lock taken without contention is held before
// the watch on its node is set: a lock released sooner (most are) never
// costs the request. The watch only serves to notice a deletion from
// outside (an operator); the loss of the session is seen without it.
const watchDelay = 50 * time.Millisecond

// hold makes the Handle of node, the lowest in its directory, with its
// czxid and the session that owns it. The watch on its node is set
// watchDelay later (Handle.arm), also when the contention set one: that
// one's events, which may have come before the Handle was entered in the
// session's routing table, reach no one.
func (s *session) hold(key, node string, czxid, owner int64) (*Handle, error) {
	token, err := s.l.cfg.Token(czxid)
	if err != nil { // a zxid beyond 2^62: cannot happen (see doc.go)
		return nil, err
	}
	s.mu.Lock()
	h := newHandle(s, key, node, token, owner, s.timeout)
	switch {
	case s.l.life.IsClosing():
		s.mu.Unlock()
		return nil, locker.ErrClosed
	case owner != s.sessID || s.lostSess == s.sessID:
		// The session changed, or its locks were given up while we
		// waited for the answer.
		s.mu.Unlock()
		return nil, errNodeGone
	case s.leaseStaleLocked(time.Now()):
		// No request of late was answered: the session may expire
		// before this lock could be reported lost.
		s.mu.Unlock()
		return nil, errNodeGone
	}
	if !s.l.life.Hold(h) {
		s.mu.Unlock()
		return nil, locker.ErrClosed
	}
	// The timer only starts arm: a lock released (or lost) sooner stops it
	// (stopWatch); one that fires after Close began starts an arm that
	// returns at once, or none.
	h.watchTimer = time.AfterFunc(watchDelay, func() { s.l.life.Go(h.arm) })
	s.mu.Unlock()
	return h, nil
}

// logf logs through the WithLogger logger.
func (l *Locker) logf(format string, args ...any) { l.cfg.logger.Printf(format, args...) }
