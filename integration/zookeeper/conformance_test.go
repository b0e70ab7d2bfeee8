package zookeeper_test

import (
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/zookeeper"
)

func TestConformance(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	admin := adminConn(t, srv.Addr())
	var reg testserver.Registry[*testserver.Proxy]
	// A server that grants far less than asked (maxSessionTimeout=1600ms,
	// 10s asked), started by the first client of the case that needs it.
	var (
		shortMu  sync.Mutex
		shortSrv *testserver.Server
	)
	shortClient := func(t *testing.T) (locker.Locker, error) {
		shortMu.Lock()
		if shortSrv == nil {
			shortSrv = shortSessionServer(t)
			t.Cleanup(func() {
				shortMu.Lock()
				shortSrv = nil
				shortMu.Unlock()
			})
		}
		addr := shortSrv.Addr()
		shortMu.Unlock()
		c := connectAskingLong(t, addr)
		reg.Put(c.l, c.px)
		return c.l, nil
	}
	conformance.Run(t, conformance.Harness{
		IgnoreGoroutines: testserver.ProxyGoroutines,
		// Each client is another process: its own connections and
		// sessions, through its own proxy. No options: the default TTL is
		// locker.DefaultTTL (TTL/Default).
		NewLocker: func(t *testing.T) locker.Locker {
			c := defaultClient(t, srv.Addr())
			reg.Put(c.l, c.px)
			return c.l
		},
		// A killed process: its TCP connection closes without a
		// closeSession, so the server keeps the session (and the lock)
		// until the session timeout, as for a real crash.
		Crash: func(t *testing.T, l locker.Locker) { reg.Get(t, l, "Crash").Crash(t) },
		// A partition: nothing passes either way. The server keeps the
		// session until it has heard nothing for the session timeout; the
		// holder gives its locks up a drift margin before that.
		Cut: func(t *testing.T, l locker.Locker) func() {
			px := reg.Get(t, l, "Cut")
			px.Blackhole(t)
			return func() { px.Heal(t) }
		},
		// Every connection closed from outside: go-zookeeper reconnects
		// in the same session at once, and the locks stand.
		Reset: func(t *testing.T, l locker.Locker) { reg.Get(t, l, "Reset").ResetAll(t) },
		// An operator deletes the holder's node (rmr, deleteall).
		Steal: func(t *testing.T, h locker.Handle) {
			if err := admin.Delete(h.(*zookeeper.Handle).Node(), -1); err != nil {
				t.Fatalf("Steal: delete %s: %v", h.(*zookeeper.Handle).Node(), err)
			}
		},
		// The server grants a session far shorter than asked: the Locker
		// works with the granted timeout from the first moment (see
		// TestGrantedSessionShorterThanAsked for the one-way cut that
		// showed it did not).
		Unsafe: []conformance.UnsafeConfig{{
			Name:     "maxSessionTimeout=1600ms,asked=10s",
			New:      shortClient,
			MadeSafe: true,
		}, {
			// Two Lockers reading one connection's events channel: each
			// would miss the events the other read. The second is refused.
			Name:    "two-New-on-one-events-channel",
			Mention: "events channel",
			New: func(t *testing.T) (locker.Locker, error) {
				conn, events := plainConn(t, srv.Addr())
				first := zookeeper.New(conn, events, zookeeper.WithSessionTimeout(sessionTimeout))
				t.Cleanup(func() { _ = first.Close() })
				return zookeeper.New(conn, events, zookeeper.WithSessionTimeout(sessionTimeout)), nil
			},
		}, {
			// New given another connection's events channel: it would
			// follow another session. Refused.
			Name:    "New-with-another-connection's-events-channel",
			Mention: "events channel",
			New: func(t *testing.T) (locker.Locker, error) {
				conn, _ := plainConn(t, srv.Addr())
				_, events := plainConn(t, srv.Addr())
				return zookeeper.New(conn, events, zookeeper.WithSessionTimeout(sessionTimeout)), nil
			},
		}, {
			// New told the timeout its connection asked for, 30s, which
			// the server (maxSessionTimeout 10s) does not grant: the
			// session has 10s, and the Locker would give a disconnected
			// lock up too late. Refused once the server is asked.
			Name:    "New-declaring-a-timeout-the-server-does-not-grant",
			Mention: "WithSessionTimeout",
			New: func(t *testing.T) (locker.Locker, error) {
				conn, events, err := zk.Connect([]string{srv.Addr()}, 30*time.Second, zk.WithLogger(quiet{}))
				if err != nil {
					return nil, err
				}
				t.Cleanup(conn.Close)
				return zookeeper.New(conn, events, zookeeper.WithSessionTimeout(30*time.Second)), nil
			},
		}},
		// The holder's watch on its own node fires at once.
		LossBound: time.Second,
		URL:       "zookeeper://" + srv.Addr() + "/locker?ttl=" + sessionTimeout.String(),
		// A lock's lease is the timeout of a session of its own TTL: the
		// expiry, cut and steal cases ask for 2s, so their locks live in
		// a second session of each Locker (the first is the default
		// TTL's, 3s).
		TTL: 2 * time.Second,
		// What the test server grants: it runs with tickTime=500ms
		// (build/docker/serve.sh writes it into zoo.cfg for the local
		// image; testserver sets ZOO_TICK_TIME=500 for the official one)
		// and no minSessionTimeout or maxSessionTimeout of its own, so
		// ZooKeeper's defaults apply: 2 and 20 ticks. TTL/Range's 24h and
		// TTL/Default's 30s are given the ceiling.
		LeaseFloor:     time.Second,      // minSessionTimeout = 2 × tickTime
		LeaseCeiling:   10 * time.Second, // maxSessionTimeout = 20 × tickTime
		NoInspectLease: "a node's stat names its session, not the session's timeout",
		// A dead or cut-off holder's session ends one session timeout
		// after the server last heard from it (rounded up to the next
		// tick, 500ms here); then the next waiter's watch fires.
		ExpiryBound: 2 * sessionTimeout,
		// TTL/SilentHolder: the lease reported, plus the tick and the
		// waiter's wake-up.
		ExpirySlack: time.Second,
		// go-zookeeper's Conn.Close waits up to a second for the server to
		// confirm the end of the session: Close of a cut-off Locker (which
		// owns its connection) takes that second.
		CtxSlack: 1200 * time.Millisecond,
	})
}
