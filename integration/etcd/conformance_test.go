package etcd_test

import (
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/etcd"
	"github.com/go-locker/locker/integration/testserver"
)

func TestConformance(t *testing.T) {
	srv := testserver.Etcd(t)
	admin := newEtcdClient(t, srv.Addr())
	var reg testserver.Registry[*testserver.Proxy]
	conformance.Run(t, conformance.Harness{
		IgnoreGoroutines: testserver.ProxyGoroutines,
		// Each client is another process: its own etcd client, through its
		// own proxy.
		NewLocker: func(t *testing.T) locker.Locker {
			c := newClient(t, srv.Addr())
			reg.Put(c.l, c.px)
			return c.l
		},
		// A killed process: its connections close and it never renews its
		// lease again; the server expires the lease one TTL after the last
		// renewal and deletes its keys.
		Crash: func(t *testing.T, l locker.Locker) { reg.Get(t, l, "Crash").Crash(t) },
		// Every connection of the client closed from outside; it reconnects.
		Reset: func(t *testing.T, l locker.Locker) { reg.Get(t, l, "Reset").ResetAll(t) },
		// A partition: nothing passes either way until it heals.
		Cut: func(t *testing.T, l locker.Locker) func() {
			px := reg.Get(t, l, "Cut")
			px.Partition(t)
			return func() { px.Heal(t) }
		},
		// An operator deletes the holder's key.
		Steal: func(t *testing.T, h locker.Handle) {
			k := h.(*etcd.Handle).EtcdKey()
			if _, err := admin.Delete(testCtx(t, 10*time.Second), k); err != nil {
				t.Fatalf("Steal: delete %s: %v", k, err)
			}
		},
		// The holder's watch on its own key fires at once.
		LossBound: time.Second,
		URL:       "etcd://" + srv.Addr() + "/locker?ttl=" + ttl.String(),
		TTL:       ttl,
		// etcd counts leases in whole seconds and grants at least its
		// minimum lease, 1.5 election timeouts rounded up: 2s with the
		// default --election-timeout=1000 the test server runs with.
		LeaseGrain: time.Second,
		LeaseFloor: 2 * time.Second,
		// A dead holder's lease ends one TTL after its last renewal (the
		// server checks every 500ms); then the next waiter's watch fires.
		ExpiryBound: 3 * ttl,
	})
}
