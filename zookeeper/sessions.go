package zookeeper

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// session is one ZooKeeper connection of a Locker and the session it
// carries (a new one after an expiry: go-zookeeper reconnects on the same
// connection). Its timeout is the lease of every lock whose node it owns:
// the server deletes a silent session's ephemeral nodes one timeout after
// it last heard from it. Everything that follows a session (its
// supervisor, loss deadlines, lease checks, watches, orphans and ghosts)
// lives here, once per session.
type session struct {
	l      *Locker
	conn   *zk.Conn
	owned  bool            // dialed by the Locker: closed when retired, and by Close
	link   *link           // nil on your connection (New): no view below go-zookeeper
	events <-chan zk.Event // New: your connection's events channel, which the supervisor reads
	asked  time.Duration   // the timeout asked (dialed), or declared (New)

	// ready is closed once the session may carry locks (its credentials
	// added: see setup), with setupErr set if it may not.
	ready    chan struct{}
	setupErr error
	// stop is closed when the session is retired (idle) or the Locker
	// closes: its supervisor returns.
	stop     chan struct{}
	stopOnce sync.Once

	// Under l.smu: the pool's view (see sessionFor and reap).
	inflight int         // Acquires using the session now
	used     bool        // used since the last idle check
	retired  bool        // taken out of the pool: no new user
	idle     *time.Timer // the idle check (not for the primary session)

	// Events from the connection's callback, for the supervisor.
	qmu   sync.Mutex
	queue []zk.Event
	kick  chan struct{}

	risk      backend.Risk               // disconnected: the session's locks are at risk
	syncs     syncLog                    // the Locker's syncs through a follower (see keepalive.go)
	role      atomic.Pointer[serverRole] // what the server of the current connection said it is; nil: not known
	mu        sync.Mutex
	sessID    int64            // the session the Locker knows of; 0 before the first
	connected bool             // sessID is live and connected
	lostSess  int64            // a session whose locks were given up while disconnected
	timeout   time.Duration    // granted (dialed) or declared (New) session timeout
	deadline  time.Time        // while disconnected: when the locks are given up
	discAt    time.Time        // when the connection was last lost
	sessCh    chan struct{}    // closed and replaced at every change of the above
	orphans   map[string]int64 // nodes to delete once the session answers again
	ghosts    map[ghost]int64  // creates of unknown outcome to look for, likewise

	// gen counts the connection's session events (see connGen).
	gen atomic.Uint64

	wmu     sync.Mutex
	watches map[string]*nodeWatch // live watches on other contenders' nodes, by path

	// held are the holders whose node is watched through the connection's
	// event callback (a dialed session: see Handle.arm), by node path.
	hmu  sync.Mutex
	held map[string]*Handle
}

func newSession(l *Locker, asked time.Duration) *session {
	return &session{
		l:       l,
		asked:   asked,
		timeout: asked,
		ready:   make(chan struct{}),
		stop:    make(chan struct{}),
		kick:    make(chan struct{}, 1),
		sessCh:  make(chan struct{}),
		orphans: make(map[string]int64),
		ghosts:  make(map[ghost]int64),
		watches: make(map[string]*nodeWatch),
		held:    make(map[string]*Handle),
	}
}

// sessionIdle is how long a session other than the primary one stays
// open without a lock or an Acquire: it is closed at the first idle check
// that finds it unused since the one before, so between one and two
// sessionIdle after its last use.
const sessionIdle = 10 * time.Second

// sessionFor returns the session for a lock of ttl, dialing one if there
// is none, counted as in use until release is called. The lease is ttl
// rounded down to a lease step (leaseStep), or the server's floor or
// ceiling as its grants showed them: a session is shared by every lock of
// its lease. A Locker that cannot dial (New without WithServers) uses your
// session for every ttl at or above its timeout (a shorter lease, reported)
// and refuses a shorter ttl.
func (l *Locker) sessionFor(ttl time.Duration) (*session, func(), error) {
	l.smu.Lock()
	defer l.smu.Unlock()
	s, err := l.sessionForLocked(ttl)
	if err != nil {
		return nil, nil, err
	}
	s.inflight++
	s.used = true
	return s, func() {
		l.smu.Lock()
		s.inflight--
		l.smu.Unlock()
	}, nil
}

func (l *Locker) sessionForLocked(ttl time.Duration) (*session, error) {
	if l.life.IsClosing() {
		// Close takes the sessions to shut down once it began: a session
		// dialed now could be missed.
		return nil, locker.ErrClosed
	}
	if p := l.primary; !p.owned && p.asked <= ttl && (leaseStep(ttl) <= p.asked || l.servers == nil) {
		// New: your session's timeout lies between the lease step and
		// the TTL (nearer than the step), or no other can be dialed.
		return p, nil
	}
	lease := leaseStep(ttl)
	if l.ceiling > 0 && lease > l.ceiling {
		lease = l.ceiling
	}
	if l.floor > 0 && lease < l.floor {
		lease = l.floor
	}
	if s := l.sessions[lease]; s != nil {
		return s, nil
	}
	if l.servers == nil {
		return nil, fmt.Errorf("%w: a TTL of %v needs a session whose timeout is at most that, and this Locker (New) has only your connection's session, of %v, and no servers to dial another: pass zookeeper.WithServers to New, or take the lock with a TTL of at least %v",
			locker.ErrInvalidOption, ttl, l.primary.asked, l.primary.asked)
	}
	return l.dialLocked(lease, false)
}

// dialLocked dials a session whose timeout is lease, enters it in the
// pool, starts its supervisor and its setup, and, unless primary, its
// idle check.
func (l *Locker) dialLocked(lease time.Duration, primary bool) (*session, error) {
	s := newSession(l, lease)
	s.owned = true
	s.link = newLink(lease, l.cfg.tls)
	conn, _, err := zk.Connect(l.servers, lease,
		zk.WithDialer(s.link.dial),
		zk.WithHostProvider(s.link.hosts),
		zk.WithLogger(l.cfg.logger),
		zk.WithEventCallback(s.enqueue))
	if err != nil {
		return nil, err
	}
	s.conn = conn
	l.sessions[lease] = s
	if primary {
		l.primary = s
	}
	if !l.life.Go(func() { s.supervise(nil) }) || !l.life.Go(s.setup) {
		// Close has begun: the session ends with it.
		s.setupErr = locker.ErrClosed
		close(s.ready)
		return s, nil
	}
	if !primary {
		s.idle = time.AfterFunc(sessionIdle, func() { l.life.Go(func() { l.reap(s) }) })
	}
	return s, nil
}

// setup adds the WithAuth credentials to a dialed session once it is
// established (go-zookeeper sends them again after every reconnect), then
// opens the session to locks (ready). A session whose credentials are
// refused carries no lock: it is taken out of the pool, and the Acquire
// that waited for it fails with the error.
func (s *session) setup() {
	defer close(s.ready)
	if len(s.l.cfg.auth) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(s.l.life.Closing())
	defer cancel()
	stop := context.AfterFunc(doneContext{s.stop}, cancel)
	defer stop()
	if _, _, err := s.awaitConnected(ctx); err != nil {
		s.setupErr = err
		return
	}
	for _, a := range s.l.cfg.auth {
		if err := s.l.call(ctx, func() error { return s.conn.AddAuth(a.scheme, a.auth) }, nil); err != nil {
			s.setupErr = fmt.Errorf("zookeeper: adding %s auth: %w", a.scheme, err)
			s.l.smu.Lock()
			s.l.retireLocked(s)
			primary := s == s.l.primary
			s.l.smu.Unlock()
			if !primary {
				s.shutdown()
			}
			return
		}
	}
}

// reap is the idle check of a session other than the primary one: it
// retires the session if no lock of it is held, no Acquire uses it, and
// none used it since the last check; else it checks again later.
func (l *Locker) reap(s *session) {
	l.smu.Lock()
	if s.retired {
		l.smu.Unlock()
		return
	}
	busy := s.inflight > 0 || s.used
	if !busy {
		for _, h := range l.life.Held() {
			if h.s == s {
				busy = true
				break
			}
		}
	}
	s.used = false
	if busy {
		s.idle.Reset(sessionIdle)
		l.smu.Unlock()
		return
	}
	l.retireLocked(s)
	l.smu.Unlock()
	s.shutdown()
}

// retireLocked takes s out of the pool: no lock is taken on it any more.
func (l *Locker) retireLocked(s *session) {
	s.retired = true
	for k, v := range l.sessions {
		if v == s {
			delete(l.sessions, k)
		}
	}
}

// shutdown stops s's supervisor and idle check and closes its connection
// if the Locker dialed it (which ends the session: the server deletes its
// nodes). go-zookeeper's Close waits up to a second for the server.
func (s *session) shutdown() {
	s.stopOnce.Do(func() {
		close(s.stop)
		if s.idle != nil {
			s.idle.Stop()
		}
		if s.owned {
			s.conn.Close()
		}
	})
}

// learnGrant records what the server granted a session asked for asked:
// a grant below the ask is the server's ceiling (maxSessionTimeout), one
// above it its floor (minSessionTimeout); later leases beyond either are
// given the session of that grant, which the pool finds under the
// granted value too.
func (l *Locker) learnGrant(s *session, granted time.Duration) {
	l.smu.Lock()
	defer l.smu.Unlock()
	if s.retired || granted == s.asked {
		return
	}
	if granted < s.asked {
		l.ceiling = granted
	} else {
		l.floor = granted
	}
	if l.sessions[granted] == nil {
		l.sessions[granted] = s
	}
}

// grantedTimeout is the session's timeout as granted by the server
// (dialed) or declared (New); zero before its first session.
func (s *session) grantedTimeout() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessID == 0 {
		return 0
	}
	return s.timeout
}

// attemptBound is how long one attempt (TryAcquire) waits for the session:
// its timeout (the granted one, once known), at most locker.DefaultTTL (a
// session asked for a day may not be granted one).
func (s *session) attemptBound() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return min(s.timeout, locker.DefaultTTL)
}
