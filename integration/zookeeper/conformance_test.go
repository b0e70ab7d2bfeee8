package zookeeper_test

import (
	"sync"
	"testing"
	"time"

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
		// Each client is another process: its own connection and session,
		// through its own proxy.
		NewLocker: func(t *testing.T) locker.Locker {
			c := newClient(t, srv.Addr())
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
		}},
		// The holder's watch on its own node fires at once.
		LossBound: time.Second,
		URL:       "zookeeper://" + srv.Addr() + "/locker?session_timeout=" + sessionTimeout.String(),
		// The lease is the session timeout: WithTTL below it is rejected,
		// at or above it accepted (see the package documentation).
		TTL:            sessionTimeout,
		NoInspectLease: "a node's stat names its session, not the session's timeout",
		// A dead or cut-off holder's session ends one session timeout
		// after the server last heard from it (rounded up to the next
		// tick, 500ms here); then the next waiter's watch fires.
		ExpiryBound: 2 * sessionTimeout,
		// go-zookeeper's Conn.Close waits up to a second for the server to
		// confirm the end of the session: Close of a cut-off Locker (which
		// owns its connection) takes that second.
		CtxSlack: 1200 * time.Millisecond,
	})
}
