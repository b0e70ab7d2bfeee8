package etcd_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/etcd"
	"github.com/go-locker/locker/integration/testserver"
)

// clusterClient is a Locker whose client dials every member of a cluster,
// each through a proxy of its own.
type clusterClient struct {
	l   *etcd.Locker
	pxs []*testserver.Proxy
}

func newClusterClient(t testing.TB, ms []*testserver.Server, opts ...etcd.Option) clusterClient {
	t.Helper()
	var pxs []*testserver.Proxy
	var addrs []string
	for _, m := range ms {
		px := testserver.NewProxy(t, m.Addr())
		pxs = append(pxs, px)
		addrs = append(addrs, px.Addr())
	}
	l := etcd.New(newEtcdClient(t, addrs...), opts...)
	t.Cleanup(func() { _ = l.Close() })
	return clusterClient{l, pxs}
}

func TestClusterConformance(t *testing.T) {
	ms := testserver.EtcdCluster(t)
	var addrs []string
	for _, m := range ms {
		addrs = append(addrs, m.Addr())
	}
	admin := newEtcdClient(t, addrs...)
	var reg testserver.Registry[[]*testserver.Proxy]
	conformance.Run(t, conformance.Harness{
		IgnoreGoroutines: testserver.ProxyGoroutines,
		NewLocker: func(t *testing.T) locker.Locker {
			c := newClusterClient(t, ms)
			reg.Put(c.l, c.pxs)
			return c.l
		},
		Crash: func(t *testing.T, l locker.Locker) {
			for _, px := range reg.Get(t, l, "Crash") {
				px.Crash(t)
			}
		},
		// Every connection of the client, to every member, closed from
		// outside; it reconnects.
		Reset: func(t *testing.T, l locker.Locker) {
			for _, px := range reg.Get(t, l, "Reset") {
				px.ResetAll(t)
			}
		},
		// Cut puts the partition between the client and every member.
		Cut: func(t *testing.T, l locker.Locker) func() {
			pxs := reg.Get(t, l, "Cut")
			for _, px := range pxs {
				px.Partition(t)
			}
			return func() {
				for _, px := range pxs {
					px.Heal(t)
				}
			}
		},
		Steal: func(t *testing.T, h locker.Handle) {
			if _, err := admin.Delete(testCtx(t, 10*time.Second), h.(*etcd.Handle).EtcdKey()); err != nil {
				t.Fatalf("Steal: %v", err)
			}
		},
		LossBound: time.Second,
		URL:       "etcd://" + strings.Join(addrs, ",") + "/locker?ttl=" + ttl.String(),
		TTL:       ttl,
		// etcd counts leases in whole seconds and grants at least its
		// minimum lease, 1.5 election timeouts rounded up: 2s with the
		// default --election-timeout=1000 the test server runs with.
		LeaseGrain:  time.Second,
		LeaseFloor:  2 * time.Second,
		ExpiryBound: 3 * ttl,
	})
}

// The leader paused on the 3-member cluster: the lock stays exclusive; a
// holder that cannot renew reports the loss before anyone else gets the
// key. The TTL (5s) outlasts an election (1s election timeout), so the
// holder usually keeps its lock through it; B's attempts may fail while
// there is no leader (its own lease may run out), never with two holders.
func TestClusterLeaderPaused(t *testing.T) {
	const ttl = 5 * time.Second
	ms := testserver.EtcdCluster(t)
	ctx := testCtx(t, 2*time.Minute)
	a, b := newClusterClient(t, ms), newClusterClient(t, ms)
	k := uniqueKey(t)
	h := mustAcquire(t, ctx, a.l, k, locker.WithTTL(ttl))
	leader := testserver.EtcdLeader(t, ms)
	leader.Pause(t)
	paused := time.Now()
	var aEnded atomic.Int64 // when A's lock ended, after the pause
	go func() {
		<-h.Done()
		aEnded.Store(int64(time.Since(paused)))
	}()
	resume := sync.OnceFunc(func() {
		leader.Resume(t)
		t.Logf("leader resumed %v after the pause", time.Since(paused))
		testserver.WaitEtcdLeader(t, ms)
		t.Logf("cluster settled %v after the pause", time.Since(paused))
	})
	defer resume()
	released := false
	for {
		actx, cancel := context.WithTimeout(ctx, 2*ttl)
		hb, err := b.l.Acquire(actx, k, locker.WithTTL(ttl))
		cancel()
		if err == nil {
			if !released && !closed(h.Done()) {
				t.Fatal("B holds the key while A's lock is still open: two holders")
			}
			if hb.Token() <= h.Token() {
				t.Errorf("B's token %d not above A's %d", hb.Token(), h.Token())
			}
			t.Logf("B got the key %v after the leader paused (A released: %v; A: %v)", time.Since(paused), released, h.Err())
			_ = hb.Release(ctx)
			return
		}
		t.Logf("B's attempt %v after the pause: %v", time.Since(paused), err)
		if time.Since(paused) > 3*ttl && !released {
			if closed(h.Done()) {
				t.Logf("A lost its lock: %v", h.Err())
			} else {
				t.Logf("A kept its lock for %v after the leader paused", time.Since(paused))
				resume()
				// The resumed old leader may take a request it can no
				// longer commit ("request timed out"): the lock is then
				// given up all the same, and its key deleted later. Or
				// it may revoke A's lease, which A kept alive through the
				// new leader all along (etcd issue #15247, seen on 3.5.17
				// too, see the package documentation): A's watch then
				// reports the loss, and Release says so.
				releasing := time.Since(paused)
				err := h.Release(ctx)
				ended := time.Duration(aEnded.Load())
				t.Logf("A's Release %v after the pause: %v (A's lock ended %v after the pause)", time.Since(paused), err, ended)
				switch {
				case err == nil:
				case errors.Is(err, locker.ErrLost):
					t.Logf("A's lease was revoked when the old leader resumed (A's lock ended %v after the pause, Release began %v after it)", ended, releasing)
				case !errors.Is(h.Err(), locker.ErrReleased):
					t.Fatalf("A's lock after a failed Release: %v, want ErrReleased", h.Err())
				}
			}
			released = true
		}
		if time.Since(paused) > 10*ttl {
			t.Fatal("B never got the key")
		}
	}
}

// A member restarted under a holder whose client dials all members: the
// lock stays exclusive throughout.
func TestClusterMemberRestart(t *testing.T) {
	ms := testserver.EtcdCluster(t)
	ctx := testCtx(t, 2*time.Minute)
	a, b := newClusterClient(t, ms), newClusterClient(t, ms)
	k := uniqueKey(t)
	h := mustAcquire(t, ctx, a.l, k, locker.WithTTL(ttl))
	for _, m := range ms {
		m.Stop(t)
		m.Start(t)
		if hb, err := b.l.TryAcquire(ctx, k); err == nil {
			if !closed(h.Done()) {
				t.Fatalf("two holders after restarting %s", m)
			}
			_ = hb.Release(ctx)
			return
		} else if !errors.Is(err, locker.ErrNotAcquired) {
			t.Logf("TryAcquire after restarting %s: %v", m, err)
		}
	}
	if closed(h.Done()) {
		t.Logf("A lost its lock over the restarts: %v", h.Err())
		return
	}
	if err := h.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}
