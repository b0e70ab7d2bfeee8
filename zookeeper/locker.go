package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/backoff"
)

// cleanupWait bounds how long an Acquire that gives up (its context ended,
// TryAcquire found the key held) waits for the deletion of its node before
// it returns; the deletion itself goes on until the server answers.
const cleanupWait = 2 * time.Second

// closeWait bounds how long Close waits for the deletion of held nodes,
// and then, on a caller's connection (New), for the calls and goroutines
// still in flight.
const closeWait = 3 * time.Second

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

func withPort(s string) (string, error) {
	if s == "" {
		return "", errors.New("empty server address")
	}
	if host, port, err := net.SplitHostPort(s); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || host == "" {
			return "", fmt.Errorf("bad server address %q (want host:port, port 1-65535)", s)
		}
		return s, nil
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		// A bracketed IPv6 address without a port.
		if ip := net.ParseIP(s[1 : len(s)-1]); ip != nil && strings.Contains(s, ":") {
			return net.JoinHostPort(ip.String(), "2181"), nil
		}
		return "", fmt.Errorf("bad server address %q", s)
	}
	if strings.Contains(s, "]") || strings.Count(s, ":") > 1 && !strings.HasPrefix(s, "[") {
		// A bare IPv6 address without brackets is ambiguous.
		if ip := net.ParseIP(s); ip != nil {
			return net.JoinHostPort(s, "2181"), nil
		}
		return "", fmt.Errorf("bad server address %q", s)
	}
	return net.JoinHostPort(s, "2181"), nil
}

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
	h, err := l.acquire(ctx, "acquire", key, true, opts)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// TryAcquire takes key if nobody holds it or waits for it, and fails with an
// error wrapping locker.ErrNotAcquired otherwise, without waiting.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	h, err := l.acquire(ctx, "try-acquire", key, false, opts)
	if err != nil {
		return nil, err
	}
	return h, nil
}

func (l *Locker) acquire(ctx context.Context, op, key string, wait bool, opts []locker.Option) (*Handle, error) {
	// Close ends the call through cctx; Why tells the caller's context
	// from Close.
	cctx, done, err := l.life.Enter(ctx, op, key)
	if err != nil {
		return nil, err
	}
	defer done()
	o, err := locker.ApplyOptions(opts...)
	if err != nil {
		return nil, locker.KeyError(op, key, err)
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
			return nil, locker.KeyError(op, key, l.life.Why(cctx, err))
		}
		if o.TTL != 0 && o.TTL < timeout {
			return nil, locker.KeyError(op, key, fmt.Errorf("%w: TTL %v is below the session timeout %v, which is the lease of every lock of this Locker (connect with a shorter session timeout for shorter leases)", locker.ErrInvalidOption, o.TTL, timeout))
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
		return nil, locker.KeyError(op, key, l.life.Why(cctx, err))
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
	dir := LockDir(l.cfg.root, key)
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

// isConnErr reports an error after which a request may or may not have
// been applied: the connection broke before the answer came.
func isConnErr(err error) bool {
	return errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrNoServer) ||
		errors.Is(err, zk.ErrSessionMoved) || errors.Is(err, zk.ErrClosing)
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

// createdNode is what the create of a contender's node told.
type createdNode struct {
	node string
	// dir is the lock directory's stat just after the create, in the same
	// transaction (nil when the node was adopted or created without the
	// multi): its NumChildren says whether the node is alone, its Mzxid is
	// the node's czxid.
	dir *zk.Stat
	sid int64 // the session that answered, with dir
	// retried: an earlier create of the same GUID lost its answer, so a
	// second node of ours may yet appear (see Handle.dup).
	retried bool
}

// createNode creates the contender's protected ephemeral-sequential node in
// dir, making the directory when it is missing, and adopts the node when
// the answer to the create was lost with the connection.
//
// The create goes out in a multi with an empty write to the directory's
// data (unconditional, version -1): the answer to that write is the
// directory's stat just after the create, in the same transaction, which
// says whether anyone else is in the queue. An uncontended acquisition so
// costs one request, as a bare create does. A server that refuses the write
// (an ACL on the directory without WRITE) makes the Locker use plain
// creates from then on.
func (l *Locker) createNode(ctx context.Context, dir, guid string) (createdNode, error) {
	prefix := dir + "/" + nodeName(guid)
	retried := false
	for tries := 0; ; tries++ {
		var c createdNode
		multi := !l.noMulti.Load() && !l.hot.recent(dir)
		sid := l.conn.SessionID()
		err := l.call(ctx, func() error {
			if !multi {
				p, err := l.conn.Create(prefix, nil, zk.FlagEphemeral|zk.FlagSequence, l.cfg.acl)
				c.node = p
				return err
			}
			r, err := l.conn.Multi(
				&zk.CreateRequest{Path: prefix, Flags: zk.FlagEphemeral | zk.FlagSequence, Acl: l.cfg.acl},
				&zk.SetDataRequest{Path: dir, Version: -1})
			if err == nil && len(r) == 2 && r[1].Stat != nil {
				c = createdNode{node: r[0].String, dir: r[1].Stat, sid: sid}
				if now := l.conn.SessionID(); now != sid {
					// The session changed around the request: which one
					// owns the node is not known here; contend reads it.
					c.dir, c.sid = nil, 0
				}
				return nil
			}
			if err != nil && len(r) == 2 && r[0].Error == nil && r[1].Error != nil && !isConnErr(err) {
				// The create would have gone through; the write to the
				// directory did not.
				return errMultiRefused{err}
			}
			if err == nil {
				return fmt.Errorf("zookeeper: unexpected answer to a multi: %+v", r)
			}
			return err
		}, func(err error) {
			// Abandoned, and created all the same: a node nobody
			// contends with would block everyone after it.
			switch {
			case err == nil:
				l.deleteDetached(c.node)
			case isConnErr(err):
				l.dropCreate(dir, guid, sid)
			}
		})
		var refused errMultiRefused
		switch {
		case err == nil:
			c.retried = retried
			return c, nil
		case errors.As(err, &refused) || errors.Is(err, zk.ErrUnknown) || errors.Is(err, zk.ErrAPIError) || isUnimplemented(err):
			// Nothing was applied: go on with plain creates.
			l.logf("zookeeper: creating lock nodes without the directory write from now on: %v", err)
			l.noMulti.Store(true)
		case errors.Is(err, zk.ErrNoNode) && tries < 8:
			if err := l.ensureDir(ctx, dir); err != nil {
				return createdNode{}, err
			}
		case isConnErr(err) && tries < 8 && ctx.Err() == nil && !l.life.IsClosing():
			// The create may have been applied: look for our GUID, until
			// a listing answers (creating again before that could leave
			// the first node behind as a ghost of our own).
			retried = true
			found, err := l.findOwnRetrying(ctx, dir, guid)
			if err != nil {
				l.dropCreate(dir, guid, sid)
				return createdNode{}, err
			}
			if found != "" {
				return createdNode{node: found, retried: true}, nil
			}
		default:
			if isConnErr(err) {
				// Given up with the create's outcome unknown: should it
				// have been applied, the node must not stay behind.
				l.dropCreate(dir, guid, sid)
			}
			return createdNode{}, err
		}
	}
}

// errMultiRefused says the server refused the directory write of the
// create's multi (and so applied nothing).
type errMultiRefused struct{ err error }

func (e errMultiRefused) Error() string { return e.err.Error() }
func (e errMultiRefused) Unwrap() error { return e.err }

// findOwnRetrying is findOwn repeated, once the session is back, until the
// listing is answered.
func (l *Locker) findOwnRetrying(ctx context.Context, dir, guid string) (string, error) {
	for {
		if _, _, err := l.awaitSession(ctx); err != nil {
			return "", err
		}
		found, err := l.findOwn(ctx, dir, guid)
		if !isConnErr(err) || errors.Is(err, zk.ErrClosing) {
			return found, err
		}
		// The connection is down and the Locker may not know yet.
		if !backoff.Sleep(ctx, 50*time.Millisecond) {
			return "", backend.ContextError(ctx)
		}
	}
}

// findOwn returns the path of the node in dir that carries guid, or "".
func (l *Locker) findOwn(ctx context.Context, dir, guid string) (string, error) {
	var kids []string
	err := l.call(ctx, func() error {
		k, _, err := l.conn.Children(dir)
		kids = k
		return err
	}, nil)
	if errors.Is(err, zk.ErrNoNode) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	// Should a create have been applied twice, the lowest node keeps our
	// place in the queue (contend deletes the others).
	found, seq := "", int64(0)
	for _, k := range kids {
		if n, ok := parseNode(k); ok && n.guid == guid && (found == "" || n.seq < seq) {
			found, seq = dir+"/"+k, n.seq
		}
	}
	return found, nil
}

// ensureDir creates dir and its missing parents as container nodes (or
// persistent ones, on servers without containers).
func (l *Locker) ensureDir(ctx context.Context, dir string) error {
	parts := strings.Split(strings.TrimPrefix(dir, "/"), "/")
	for i := range parts {
		p := "/" + strings.Join(parts[:i+1], "/")
		err := l.call(ctx, func() error { return l.createDir(p) }, nil)
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("zookeeper: creating %s: %w", p, err)
		}
	}
	return nil
}

func (l *Locker) createDir(p string) error {
	l.mu.Lock()
	containers := l.containers
	l.mu.Unlock()
	if containers {
		_, err := l.conn.CreateContainer(p, nil, zk.FlagContainer, l.cfg.acl)
		if !errors.Is(err, zk.ErrUnknown) && !errors.Is(err, zk.ErrAPIError) && !isUnimplemented(err) {
			return err
		}
		// A server before 3.5.3 does not know container nodes.
		l.mu.Lock()
		l.containers = false
		l.mu.Unlock()
	}
	_, err := l.conn.Create(p, nil, zk.FlagPersistent, l.cfg.acl)
	return err
}

// contend waits until the node c made is the lowest in dir (or, without
// wait, checks once) and returns the Handle.
//
// It lists the directory and watches the node just before its own. A node
// created later always has a higher sequence than ours (the sequence is
// the directory's child version, which only grows while our node keeps
// the directory alive), so the nodes before ours can only go, never come.
// When the watched node goes and it was the only one before ours, the lock
// is ours with no further request (the handoff to the head of the queue):
// for that the contender also watches its own node, so that its own
// deletion (events come in transaction order) is not missed. Otherwise
// the directory is listed again: the node that went was most likely the
// holder, and the others before it are gone too.
func (l *Locker) contend(ctx context.Context, key, dir string, c createdNode, wait bool) (*Handle, error) {
	node := c.node
	name := node[len(dir)+1:]
	var (
		own          <-chan zk.Event // watch on our own node, when set
		czxid, owner int64           // our node's, once known
		known        bool
		lower        []lockNode // the nodes before ours, by sequence, as last seen
		listed       bool       // lower is up to date but for deletions
		fresh        bool       // lower is a listing, not shortened by events since
		// The watches on the predecessor and the node before it, and
		// which nodes they are on ("": none set).
		pch, ppch          *nodeWatch
		armedPred, armedPP string
		// The connection generations of the watch on our own node and of
		// the news that emptied lower (a watch's event, or a GetW's
		// answer): a handoff with no request trusts their order, which
		// holds only within one connection (see connGen).
		ownGen, emptiedGen uint64
	)
	if c.dir != nil {
		czxid, owner, known = c.dir.Mzxid, c.sid, true
	}
	// retry reports whether err, from a request on the way, is a broken
	// connection to wait out (a waiting Acquire) rather than a failure.
	retry := func(err error) (bool, error) {
		if wait && isConnErr(err) && ctx.Err() == nil && !l.life.IsClosing() {
			if _, _, err := l.awaitSession(ctx); err != nil {
				return false, err
			}
			// go-zookeeper sets the watches again on the new connection,
			// in no particular order: events on the old ones no longer
			// come in transaction order. Set them afresh.
			listed = false
			l.dropWatch(pch)
			l.dropWatch(ppch)
			own, pch, ppch, armedPred, armedPP = nil, nil, nil, "", ""
			return true, nil
		}
		return false, err
	}
	for {
		if !listed || !known {
			var (
				kids    []string
				ownErr  error
				ch      <-chan zk.Event
				st      *zk.Stat
				kidsErr error
				g       = l.connGen()
			)
			if !known {
				// An adopted node: its stat comes with the watch on it.
				// Both requests go out back to back on the one connection.
				done := make(chan struct{})
				l.spawn(func() {
					defer close(done)
					ownErr = l.call(ctx, func() error {
						var err error
						_, st, ch, err = l.conn.GetW(node)
						return err
					}, nil)
				})
				kidsErr = l.call(ctx, func() error {
					k, _, err := l.conn.Children(dir)
					kids = k
					return err
				}, nil)
				<-done
			} else {
				kidsErr = l.call(ctx, func() error {
					k, _, err := l.conn.Children(dir)
					kids = k
					return err
				}, nil)
			}
			if errors.Is(ownErr, zk.ErrNoNode) || errors.Is(kidsErr, zk.ErrNoNode) {
				return nil, errNodeGone
			}
			if err := errors.Join(ownErr, kidsErr); err != nil {
				if again, err := retry(err); again {
					continue
				} else {
					return nil, err
				}
			}
			if !known {
				own, czxid, owner, known = ch, st.Czxid, st.EphemeralOwner, true
				ownGen = g
			}
			nodes := sortNodes(kids)
			idx := slices.IndexFunc(nodes, func(n lockNode) bool { return n.name == name })
			if idx < 0 {
				return nil, errNodeGone
			}
			// A node of ours that is not the one we contend with would
			// block the queue: one before ours would block us for good,
			// one after ours everyone once we are done, until the session
			// ends. A create retried after a lost answer makes one when
			// its first attempt was applied after all but the listing
			// that looked for it did not show it yet (on an ensemble, a
			// server behind the leader answered it). Delete it.
			for i, n := range nodes {
				if i != idx && n.guid == nodes[idx].guid {
					l.deleteDetached(dir + "/" + n.name)
				}
			}
			lower, listed, fresh = nodes[:idx], true, true
			if len(lower) > 0 {
				l.hot.mark(dir)
			}
		}
		if len(lower) == 0 {
			if own != nil {
				select {
				case ev := <-own:
					if ev.Type == zk.EventNodeDeleted || ev.Type == zk.EventNotWatching {
						return nil, errNodeGone
					}
					own = nil // data changed: the monitor watches again
				default:
				}
			} else if !fresh {
				// Without a watch on our own node its deletion could have
				// gone unseen: list again to be sure.
				listed = false
				continue
			}
			if !fresh && (ownGen != l.connGen() || emptiedGen != ownGen) {
				// The connection changed since the watches were set: the
				// deletion of our own node may come after the news of the
				// predecessor's, though it happened first. List again.
				listed = false
				continue
			}
			return l.hold(key, node, czxid, owner, own)
		}
		if !wait {
			return nil, locker.ErrNotAcquired
		}
		// Watch the predecessor, and the node before it too: when that one
		// goes, the predecessor most likely holds the lock now, and a
		// listing then (while it holds) lets our own turn come with no
		// request at all. Each node so has at most two watchers, whatever
		// the length of the queue: a release wakes the next holder and
		// the one after it, never the rest.
		pred := dir + "/" + lower[len(lower)-1].name
		pp := ""
		if len(lower) >= 2 {
			pp = dir + "/" + lower[len(lower)-2].name
		}
		var reqs []*watchReq
		var ownReq, predReq, ppReq *watchReq
		if len(lower) == 1 && own == nil {
			ownReq = &watchReq{path: node}
			reqs = append(reqs, ownReq)
		}
		if pred == armedPP && pred != armedPred {
			// The predecessor gave up: the node before it, watched
			// already, is the predecessor now.
			pch, armedPred, ppch, armedPP = ppch, armedPP, nil, ""
		}
		if pred != armedPred {
			predReq = &watchReq{path: pred, shared: true}
			reqs = append(reqs, predReq)
		}
		if pp != "" && pp != armedPP {
			ppReq = &watchReq{path: pp, shared: true}
			reqs = append(reqs, ppReq)
		}
		reqGen := l.connGen()
		l.watchAll(ctx, reqs)
		var errs []error
		if ownReq != nil {
			switch {
			case errors.Is(ownReq.err, zk.ErrNoNode):
				return nil, errNodeGone
			case ownReq.err == nil:
				own, ownGen = ownReq.ch, reqGen
			default:
				errs = append(errs, ownReq.err)
			}
		}
		if predReq != nil {
			switch {
			case errors.Is(predReq.err, zk.ErrNoNode):
				armedPred, pch = "", nil
				lower, fresh, emptiedGen = lower[:len(lower)-1], false, reqGen
				listed = len(lower) == 0
			case predReq.err == nil:
				armedPred, pch = pred, predReq.w
			default:
				armedPred, pch = "", nil
				errs = append(errs, predReq.err)
			}
		}
		if ppReq != nil {
			switch {
			case errors.Is(ppReq.err, zk.ErrNoNode):
				armedPP, ppch = "", nil
				listed = false
			case ppReq.err == nil:
				armedPP, ppch = pp, ppReq.w
			default:
				armedPP, ppch = "", nil
				errs = append(errs, ppReq.err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			if again, err := retry(err); again {
				continue
			} else {
				return nil, err
			}
		}
		if pch == nil || !listed {
			continue
		}
		if pp == "" {
			// A watch left on a node no longer before the predecessor.
			armedPP, ppch = "", nil
		}
		select {
		case <-pch.fired():
			ev, evGen := pch.ev, pch.gen
			if l.connGen() != evGen {
				evGen = 0 // read after a reconnect: maybe a re-armed watch's
			}
			armedPred, pch = "", nil
			switch ev.Type {
			case zk.EventNodeDeleted:
				lower, fresh, emptiedGen = lower[:len(lower)-1], false, evGen
				// With nodes left before it, the one that went gave up
				// waiting (the holder goes first, seen on the other
				// watch) or the listing is behind: list again.
				listed = len(lower) == 0
			case zk.EventNotWatching:
				listed = false
			}
			// Data changed: watch the same node again.
		case <-ppch.fired():
			ev := ppch.ev
			armedPP, ppch = "", nil
			if ev.Type == zk.EventNodeDeleted || ev.Type == zk.EventNotWatching {
				listed = false
			}
		case ev := <-own:
			if ev.Type == zk.EventNodeDeleted || ev.Type == zk.EventNotWatching {
				return nil, errNodeGone
			}
			own = nil
		case <-ctx.Done():
			return nil, backend.ContextError(ctx)
		}
	}
}

// watchReq is one GetW of watchAll: its path and whether the watch is
// shared (see nodeWatch), then its watch or error.
type watchReq struct {
	path   string
	shared bool
	ch     <-chan zk.Event // !shared
	w      *nodeWatch      // shared
	err    error
}

// watchAll sets the watches of reqs (GetW, not ExistsW: on a node already
// gone it sets no watch, where ExistsW would leave one behind for good),
// the requests going out back to back.
func (l *Locker) watchAll(ctx context.Context, reqs []*watchReq) {
	var wg sync.WaitGroup
	for i, r := range reqs {
		get := func() {
			if r.shared {
				r.w, r.err = l.watchNode(ctx, r.path)
				return
			}
			r.err = l.call(ctx, func() error {
				var err error
				_, _, r.ch, err = l.conn.GetW(r.path)
				return err
			}, nil)
		}
		if i == len(reqs)-1 {
			get()
			break
		}
		wg.Add(1)
		l.spawn(func() {
			defer wg.Done()
			get()
		})
	}
	wg.Wait()
}

// spawn runs f on a goroutine of the Locker's (Life.Go), or on the
// caller's once Close has stopped waiting: for the parallel requests of
// one call, which waits for them.
func (l *Locker) spawn(f func()) {
	if !l.life.Go(f) {
		f()
	}
}

// nodeWatch is a data watch on another contender's node, shared by the
// Locker's waiters. go-zookeeper cannot remove a watch, and keeps the
// channel of each GetW until the node changes, so a waiter that gives up
// (an Acquire with a timeout, tried again and again while one holder keeps
// the key) would leave one channel behind per attempt; shared, there is one
// per node watched, however many attempts.
//
// The watch enters the Locker's table before its GetW is sent, and one
// goroutine sends the GetW, waits for the event, records it, takes the
// watch out of the table (the next waiter on the node sets a new one) and
// closes done. Waiters wait for the GetW's answer as long as their context
// allows; one that gives up leaves the request to finish for the next. The
// goroutine ends with the event, when the connection closes, or when
// Close begins (no waiter is left then; the GetW itself, unanswered, is
// waited for as Close waits for every request). A new connection empties
// the table (see onSession).
type nodeWatch struct {
	path string
	gen  uint64        // the connection generation before its GetW went out
	set  chan struct{} // closed once the GetW was answered
	err  error         // the GetW's error, set before set is closed
	done chan struct{} // closed once the watch fired
	ev   zk.Event      // set before done is closed
}

// fired returns the channel closed once the watch fired; nil (never ready)
// for no watch.
func (w *nodeWatch) fired() <-chan struct{} {
	if w == nil {
		return nil
	}
	return w.done
}

// watchNode returns the Locker's watch on path, setting one (GetW) if there
// is none, once the server has answered the GetW. A node gone makes it
// fail with zk.ErrNoNode.
func (l *Locker) watchNode(ctx context.Context, path string) (*nodeWatch, error) {
	l.wmu.Lock()
	w := l.watches[path]
	if g := l.connGen(); w == nil || w.gen != g {
		// None, or one set on an older connection (the supervisor empties
		// the table on a new one, maybe not yet): set a new one.
		w = &nodeWatch{path: path, gen: g, set: make(chan struct{}), done: make(chan struct{})}
		l.watches[path] = w
		if !l.life.Go(func() { l.runWatch(w) }) {
			// Close has stopped waiting: no GetW goes out.
			delete(l.watches, path)
			w.err = locker.ErrClosed
			close(w.set)
		}
	}
	l.wmu.Unlock()
	select {
	case <-w.set:
		if w.err != nil {
			return nil, w.err
		}
		return w, nil
	case <-ctx.Done():
		return nil, backend.ContextError(ctx)
	case <-l.life.Closing().Done():
		return nil, locker.ErrClosed
	}
}

// runWatch sets w (GetW) and waits for it to fire, or for Close to begin
// (no waiter is left then).
func (l *Locker) runWatch(w *nodeWatch) {
	_, _, ch, err := l.conn.GetW(w.path)
	if err != nil {
		w.err = err
		l.dropWatch(w)
		close(w.set)
		return
	}
	close(w.set)
	var ev zk.Event
	select {
	case e, ok := <-ch:
		if ev = e; !ok {
			ev = zk.Event{Type: zk.EventNotWatching, State: zk.StateDisconnected, Path: w.path, Err: zk.ErrClosing}
		}
	case <-l.life.Closing().Done():
		ev = zk.Event{Type: zk.EventNotWatching, State: zk.StateDisconnected, Path: w.path, Err: locker.ErrClosed}
	}
	w.ev = ev
	l.dropWatch(w)
	close(w.done)
}

// clearWatches empties the Locker's table of shared watches: later waiters
// set new ones. Those that hold one keep it.
func (l *Locker) clearWatches() {
	l.wmu.Lock()
	clear(l.watches)
	l.wmu.Unlock()
}

// dropWatch takes w out of the Locker's table, so that the next waiter on
// its node sets a new watch (after a reconnect, say); those that hold w
// keep it.
func (l *Locker) dropWatch(w *nodeWatch) {
	if w == nil {
		return
	}
	l.wmu.Lock()
	if l.watches[w.path] == w {
		delete(l.watches, w.path)
	}
	l.wmu.Unlock()
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
	h := newHandle(l, key, node, czxid, owner)
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

// removeNode deletes a node the Locker gave up (an abandoned wait, a failed
// TryAcquire), waiting at most cleanupWait; the deletion goes on after that
// until the server answers, and is retried after a reconnect in the same
// session. It does not use the caller's context, which may have ended.
func (l *Locker) removeNode(node string) {
	done := make(chan struct{})
	l.deleteNode(node, done)
	t := time.NewTimer(cleanupWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-l.life.Abandoned().Done():
	}
}

// deleteDetached deletes node in the background.
func (l *Locker) deleteDetached(node string) { l.deleteNode(node, nil) }

// deleteNode deletes node on a detached call and closes done (if not nil)
// when the server answered or the attempt is handed to the next reconnect.
func (l *Locker) deleteNode(node string, done chan struct{}) {
	l.mu.Lock()
	sid, connected, closing := l.sessID, l.connected, l.life.Abandoned().Err() != nil
	if !connected && !closing {
		l.orphans[node] = sid
		l.mu.Unlock()
		if done != nil {
			close(done)
		}
		return
	}
	l.mu.Unlock()
	started := l.life.Go(func() {
		err := l.conn.Delete(node, -1)
		if isConnErr(err) && !errors.Is(err, zk.ErrClosing) {
			l.mu.Lock()
			if l.sessID == sid && !l.life.IsClosing() {
				l.orphans[node] = sid
			}
			l.mu.Unlock()
		}
		if done != nil {
			close(done)
		}
	})
	if !started && done != nil {
		close(done) // Close is over: the node ends with the session
	}
}

// call runs fn, one go-zookeeper call (which takes no context), on a
// goroutine of the Locker's, and returns its error; or ctx's error, or
// locker.ErrClosed once Close stops waiting (Life.Abandoned), if that
// comes first. An abandoned call keeps running until go-zookeeper answers
// (or its connection closes); then late, if not nil, gets its error.
func (l *Locker) call(ctx context.Context, fn func() error, late func(error)) error {
	var (
		mu        sync.Mutex
		finished  bool
		abandoned bool
		result    error
		done      = make(chan struct{})
	)
	started := l.life.Go(func() {
		err := fn()
		mu.Lock()
		if abandoned {
			mu.Unlock()
			if late != nil {
				late(err)
			}
			return
		}
		finished, result = true, err
		mu.Unlock()
		close(done)
	})
	if !started {
		return locker.ErrClosed // Close is over: fn was not sent
	}
	var err error
	select {
	case <-done:
		return result
	case <-ctx.Done():
		err = backend.ContextError(ctx)
	case <-l.life.Abandoned().Done():
		err = locker.ErrClosed
	}
	mu.Lock()
	defer mu.Unlock()
	if finished {
		return result
	}
	abandoned = true
	return err
}

// hotKeys remembers, roughly, which lock directories were found contended
// in the last hotWindow. The create of a contender's node goes out in a
// multi with a write to the directory (see createNode), which saves the
// listing when the key is free: one request for an uncontended
// acquisition. On a contended key the listing is needed anyway, and the
// bigger transaction only slows the queue: measured interleaved against
// go-zookeeper's Lock, handoffs at 8 waiters took 4-17% longer with the
// multi and the same without it. So a directory found contended gets plain
// creates for a while. The table is a fixed array of slots by hash: two
// directories that share a slot only cost each other a listing.
type hotKeys struct{ slots [256]atomic.Int64 }

// hotWindow is how long a directory found contended gets plain creates.
const hotWindow = 10 * time.Second

func hotSlot(dir string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(dir))
	return int(h.Sum32() % 256)
}

func (k *hotKeys) mark(dir string) { k.slots[hotSlot(dir)].Store(time.Now().UnixNano()) }

func (k *hotKeys) recent(dir string) bool {
	t := k.slots[hotSlot(dir)].Load()
	return t != 0 && time.Since(time.Unix(0, t)) < hotWindow
}
