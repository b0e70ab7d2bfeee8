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
// use. Make one with Connect (it owns its connection) or New (on yours).
type Locker struct {
	conn   *zk.Conn
	owns   bool
	events <-chan zk.Event // New: the channel this Locker reads (see eventReaders)
	cfg    config
	link   *link // nil for New: no view below go-zookeeper

	// life admits the calls, holds the handles, runs every goroutine of
	// the Locker and its Close. Its Closing ends every wait and the
	// goroutines that follow the session (the supervisor, the handles'
	// monitors, the shared watches); its Abandoned ends the go-zookeeper
	// calls still waited for (see call) and the clean-ups (removeNode,
	// sweepGhost).
	life *backend.Life[*Handle]

	// Events from the connection's callback, for the supervisor.
	qmu   sync.Mutex
	queue []zk.Event
	kick  chan struct{}

	mu         sync.Mutex
	sessID     int64            // the session the Locker knows of; 0 before the first
	connected  bool             // sessID is live and connected
	lostSess   int64            // a session whose locks were given up while disconnected
	timeout    time.Duration    // granted (Connect) or declared (New) session timeout
	deadline   time.Time        // while disconnected: when the locks are given up
	discAt     time.Time        // when the connection was last lost
	sessCh     chan struct{}    // closed and replaced at every change of the above
	orphans    map[string]int64 // nodes to delete once the session answers again
	ghosts     map[ghost]int64  // creates of unknown outcome to look for, likewise
	containers bool

	// gen counts the connection's session events (see connGen).
	gen atomic.Uint64

	noMulti atomic.Bool // the server refused the create's multi: plain creates
	hot     hotKeys     // directories found contended lately: plain creates

	wmu     sync.Mutex
	watches map[string]*nodeWatch // live watches on other contenders' nodes, by path
}

var _ locker.Locker = (*Locker)(nil)

func newLocker(cfg config) *Locker {
	l := &Locker{
		cfg:        cfg,
		kick:       make(chan struct{}, 1),
		watches:    make(map[string]*nodeWatch),
		sessCh:     make(chan struct{}),
		orphans:    make(map[string]int64),
		ghosts:     make(map[ghost]int64),
		containers: cfg.containers,
		timeout:    cfg.sessionTimeout,
	}
	return l
}

// start makes the Locker's lifecycle, once its configuration error (if
// any) is known, and starts the supervisor, which reads events (New's
// channel, or nil for Connect: see supervise).
func (l *Locker) start(events <-chan zk.Event) {
	l.life = backend.NewLife[*Handle](l.cfg.err)
	l.life.Go(func() { l.supervise(events) })
}

// Connect connects to the ensemble at servers ("host:port"; the port
// defaults to 2181) with a session of its own, waits until the session is
// established (and the WithAuth credentials added), and returns a Locker
// that owns the connection: Close closes it. ctx bounds the wait.
func Connect(ctx context.Context, servers []string, opts ...Option) (*Locker, error) {
	cfg := newConfig(opts)
	if cfg.err != nil {
		return nil, cfg.err
	}
	if cfg.sessionTimeout == 0 {
		cfg.sessionTimeout = DefaultSessionTimeout
	}
	if len(servers) == 0 {
		return nil, fmt.Errorf("zookeeper: Connect: %w: no servers", locker.ErrInvalidOption)
	}
	addrs := make([]string, len(servers))
	for i, s := range servers {
		a, err := withPort(s)
		if err != nil {
			return nil, fmt.Errorf("zookeeper: Connect: %w: %v", locker.ErrInvalidOption, err)
		}
		addrs[i] = a
	}
	l := newLocker(cfg)
	l.owns = true
	l.link = newLink(cfg.sessionTimeout)
	conn, _, err := zk.Connect(addrs, cfg.sessionTimeout,
		zk.WithDialer(l.link.dial),
		zk.WithHostProvider(l.link.hosts),
		zk.WithLogger(cfg.logger),
		zk.WithEventCallback(l.enqueue))
	if err != nil {
		return nil, fmt.Errorf("zookeeper: Connect: %w", err)
	}
	l.conn = conn
	l.start(nil)
	fail := func(err error) (*Locker, error) {
		_ = l.Close()
		return nil, fmt.Errorf("zookeeper: connecting to %s: %w", strings.Join(addrs, ","), err)
	}
	if _, _, err := l.awaitSession(ctx); err != nil {
		return fail(err)
	}
	for _, a := range cfg.auth {
		if err := l.call(ctx, func() error { return conn.AddAuth(a.scheme, a.auth) }, nil); err != nil {
			return fail(fmt.Errorf("adding %s auth: %w", a.scheme, err))
		}
	}
	return l, nil
}

// New returns a Locker on a connection the caller made with zk.Connect and
// keeps: Close leaves it open. events must be the channel zk.Connect
// returned; the Locker is its only reader from now on (go-zookeeper drops
// events nobody reads, so a program that needs session events too should
// register zk.WithEventCallback, which sees every event independently).
// So there is one Locker per connection: a second New on the same channel,
// while the first Locker is open, fails every call with an error wrapping
// locker.ErrUnsafeConfig (each would miss the events the other read).
// A Locker serves any number of goroutines and keys.
// WithSessionTimeout is required and must be the timeout given to
// zk.Connect; without it every call fails with an error wrapping
// locker.ErrInvalidOption. See the package documentation for what New
// cannot see that Connect can.
func New(conn *zk.Conn, events <-chan zk.Event, opts ...Option) *Locker {
	cfg := newConfig(opts)
	if cfg.err == nil && cfg.sessionTimeout == 0 {
		cfg.err = fmt.Errorf("zookeeper: New: %w: WithSessionTimeout is required (the session timeout given to zk.Connect)", locker.ErrInvalidOption)
	}
	l := newLocker(cfg)
	l.conn = conn
	if conn != nil && conn.State() == zk.StateHasSession {
		l.sessID, l.connected = conn.SessionID(), true
	}
	if conn == nil && l.cfg.err == nil {
		l.cfg.err = fmt.Errorf("zookeeper: New: %w: nil connection", locker.ErrInvalidOption)
	}
	if events == nil && l.cfg.err == nil {
		// Without session events a disconnect goes unseen (no loss is
		// reported) and an expiry leaves the Locker on the old session.
		l.cfg.err = fmt.Errorf("zookeeper: New: %w: nil events channel (pass the channel zk.Connect returned; the Locker must see every session event)", locker.ErrInvalidOption)
	}
	if events != nil && l.cfg.err == nil {
		if _, taken := eventReaders.LoadOrStore(events, l); taken {
			// Each event goes to one reader: two Lockers on one channel
			// would each miss some of the disconnects and expiries, and
			// hold locks they had lost.
			l.cfg.err = fmt.Errorf("zookeeper: New: %w: %w: the events channel is already read by another Locker, not closed; one Locker serves any number of goroutines and keys: share it", locker.ErrUnsafeConfig, locker.ErrInvalidOption)
			events = nil
		} else {
			l.events = events
		}
	}
	l.start(events)
	return l
}

// eventReaders maps each events channel given to New to the Locker that
// reads it, until that Locker is closed.
var eventReaders sync.Map // <-chan zk.Event -> *Locker

func withPort(s string) (string, error) { return backend.HostPort(s, "2181") }

// Conn returns the go-zookeeper connection the Locker uses.
func (l *Locker) Conn() *zk.Conn { return l.conn }

// SessionTimeout returns the session timeout the Locker works with: the
// one the server granted (Connect) or the one declared with
// WithSessionTimeout (New). It is the lease of every lock, and the least
// TTL that Acquire accepts. Zero before the first session.
func (l *Locker) SessionTimeout() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sessID == 0 {
		return 0
	}
	return l.timeout
}

// sessionTimeoutNow is the session timeout the Locker works with: the
// granted one (Connect) once a session was established, else the one asked
// for; the declared one (New).
func (l *Locker) sessionTimeoutNow() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.timeout
}

// Acquire waits until key is held, ctx ends, or the Locker is closed.
// Waiters are served in the order they arrived (the sequence of their
// nodes); each watches only the node before its own.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "acquire", key, true, opts))
}

// TryAcquire takes key if nobody holds it or waits for it, and fails with an
// error wrapping locker.ErrNotAcquired otherwise, without waiting.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "try-acquire", key, false, opts))
}

func (l *Locker) acquire(ctx context.Context, op, key string, wait bool, opts []locker.Option) (*Handle, error) {
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
		o.TTL = l.cfg.TTL // WithDefaultTTL; 0: the session timeout
	}

	for {
		swait := cctx
		if !wait {
			// One attempt: a disconnected Locker waits for its session at
			// most one session timeout (the granted one, once known).
			var c context.CancelFunc
			d := l.sessionTimeoutNow()
			swait, c = context.WithTimeoutCause(cctx, d,
				fmt.Errorf("none within the session timeout %v, which one attempt waits at most", d))
			defer c()
		}
		_, timeout, err := l.awaitSession(swait)
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
		if o.TTL != 0 && o.TTL < timeout {
			return nil, backend.KeyError(op, key, fmt.Errorf("%w: TTL %v is below the session timeout %v, which is the lease of every lock of this Locker (connect with a shorter session timeout for shorter leases)", locker.ErrInvalidOption, o.TTL, timeout))
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
		h, err := l.attempt(actx, key, wait)
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

// connGen returns the connection generation: a count of the session
// events the Locker has seen. A Connect Locker counts each one on
// go-zookeeper's own goroutine before go-zookeeper goes on (the callback
// runs inline), so before a new connection re-arms the old watches: a
// watch set at generation g whose event is read at generation g came on
// the connection it was set on, in transaction order with every other
// such watch. After a reconnect go-zookeeper sets the old watches again
// in no particular order, and the server fires those whose nodes changed
// meanwhile at once, in that order. New counts the events as the
// supervisor reads them from the caller's channel, a little later (see
// the package documentation).
func (l *Locker) connGen() uint64 { return l.gen.Load() }

// attempt creates a node for key and contends with it.
func (l *Locker) attempt(ctx context.Context, key string, wait bool) (*Handle, error) {
	dir := LockDir(l.cfg.Prefix, key)
	c, err := l.createNode(ctx, dir, newGUID())
	if err != nil {
		return nil, err
	}
	if c.dir != nil && c.dir.NumChildren > 1 {
		l.hot.mark(dir)
	}
	if c.dir != nil && c.dir.NumChildren == 1 {
		// The directory held nothing but our node right after its
		// create (one transaction): the lock is ours, with no read.
		h, err := l.hold(key, c.node, c.dir.Mzxid, c.sid, nil)
		if err != nil {
			l.removeNode(c.node)
			return nil, err
		}
		h.setDup(c, dir)
		return h, nil
	}
	h, err := l.contend(ctx, key, dir, c, wait)
	if err != nil {
		l.removeNode(c.node)
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
// czxid and the session that owns it. own is the watch on the node, or nil
// when none is set yet: then the Handle's monitor sets it after
// watchDelay.
func (l *Locker) hold(key, node string, czxid, owner int64, own <-chan zk.Event) (*Handle, error) {
	token, err := l.cfg.Token(czxid)
	if err != nil { // a zxid beyond 2^62: cannot happen (see doc.go)
		return nil, err
	}
	h := newHandle(l, key, node, token, owner)
	l.mu.Lock()
	switch {
	case l.life.IsClosing():
		l.mu.Unlock()
		return nil, locker.ErrClosed
	case owner != l.sessID || l.lostSess == l.sessID:
		// The session changed, or its locks were given up while we
		// waited for the answer.
		l.mu.Unlock()
		return nil, errNodeGone
	case l.leaseStaleLocked(time.Now()):
		// No request of late was answered: the session may expire
		// before this lock could be reported lost.
		l.mu.Unlock()
		return nil, errNodeGone
	}
	if !l.life.Hold(h) {
		l.mu.Unlock()
		return nil, locker.ErrClosed
	}
	if own == nil {
		// The timer only starts the monitor: a lock released (or lost)
		// sooner stops it (stopWatch); one that fires after Close began
		// starts a monitor that returns at once, or none.
		h.watchTimer = time.AfterFunc(watchDelay, func() { l.life.Go(func() { h.monitor(nil) }) })
		l.mu.Unlock()
		return h, nil
	}
	l.mu.Unlock()
	l.life.Go(func() { h.monitor(own) })
	return h, nil
}

// logf logs through the WithLogger logger.
func (l *Locker) logf(format string, args ...any) { l.cfg.logger.Printf(format, args...) }
