package etcd_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/etcd"
	"github.com/go-locker/locker/integration/testserver"
)

// others returns the members of ms but m.
func others(ms []*testserver.Server, m *testserver.Server) []*testserver.Server {
	var out []*testserver.Server
	for _, s := range ms {
		if s != m {
			out = append(out, s)
		}
	}
	return out
}

// The leader paused under a holder whose client reaches only the leader:
// the holder can no longer renew, so it must report the loss before the
// rest of the cluster (a new leader, which expires the lease one TTL after
// it took over) gives the key to a client of the other members. Both
// moments are logged; the key stays exclusive throughout.
func TestClusterLeaderPausedHolderCutOff(t *testing.T) {
	const ttl = 3 * time.Second // above the 2s minimum of a 1s election timeout
	ms := testserver.EtcdCluster(t)
	testserver.WaitEtcdLeader(t, ms)
	ctx := testCtx(t, 2*time.Minute)
	leader := testserver.EtcdLeader(t, ms)
	a := newClusterClient(t, []*testserver.Server{leader})
	b := newClusterClient(t, others(ms, leader))
	k := uniqueKey(t)
	h := mustAcquire(t, ctx, a.l, k, locker.WithTTL(ttl))

	leader.Pause(t)
	paused := time.Now()
	resume := sync.OnceFunc(func() {
		leader.Resume(t)
		testserver.WaitEtcdLeader(t, ms)
	})
	defer resume()

	lost := make(chan time.Time, 1)
	go func() {
		<-h.Done()
		lost <- time.Now()
	}()
	// B tries until it holds: while there is no leader its attempts fail
	// (or its own lease runs out); after the election it waits behind A's
	// key until the new leader expires A's lease.
	var (
		hb  locker.Handle
		got time.Time
	)
	for hb == nil {
		if time.Since(paused) > 10*ttl {
			t.Fatalf("B did not get the key within %v of the leader's pause", 10*ttl)
		}
		actx, cancel := context.WithTimeout(ctx, 3*ttl)
		r, err := b.l.Acquire(actx, k, locker.WithTTL(ttl))
		cancel()
		if err != nil {
			t.Logf("B's attempt ended %v after the pause: %v", time.Since(paused), err)
			continue
		}
		hb, got = r, time.Now()
		if !closed(h.Done()) {
			t.Fatalf("B holds the key (%v after the pause) while A, cut off with the paused leader, has not reported a loss: two holders", got.Sub(paused))
		}
	}
	defer hb.Release(ctx)
	lostAt := <-lost // Done is closed: sent at once
	t.Logf("leader paused at 0; A (on the leader only) reported the loss at %v; B (on the other members) held the key at %v; TTL %v",
		lostAt.Sub(paused), got.Sub(paused), ttl)
	if !errors.Is(h.Err(), locker.ErrLost) {
		t.Errorf("A's Err = %v, want an error wrapping ErrLost", h.Err())
	}
	if !lostAt.Before(got) {
		t.Errorf("A reported the loss at %v, not before B held the key at %v", lostAt.Sub(paused), got.Sub(paused))
	}
	if lostAt.Sub(paused) > ttl {
		t.Errorf("A reported the loss %v after the pause, later than the TTL %v after its last renewal", lostAt.Sub(paused), ttl)
	}
	if hb.Token() <= h.Token() {
		t.Errorf("B's token %d is not above A's %d", hb.Token(), h.Token())
	}
	resume()
	// A's stale Release touches nothing of B's.
	if err := h.Release(ctx); !errors.Is(err, locker.ErrLost) {
		t.Errorf("A's Release after the loss = %v, want an error wrapping ErrLost", err)
	}
	if closed(hb.Done()) {
		t.Errorf("B lost the key after A's stale Release: %v", hb.Err())
	}
}

// A holder whose client reaches one member only, while that member has no
// leader (the other two paused for longer than three election timeouts):
// the watch on its key, which requires a leader, is cancelled; the Locker
// must read and watch again rather than report a loss it does not know
// of, and once the cluster is whole, a deletion of the key from outside is
// still reported.
func TestClusterHolderKeepsLockThroughNoLeader(t *testing.T) {
	ms := testserver.EtcdCluster(t)
	testserver.WaitEtcdLeader(t, ms)
	ctx := testCtx(t, 2*time.Minute)
	var addrs []string
	for _, m := range ms {
		addrs = append(addrs, m.Addr())
	}
	admin := newEtcdClient(t, addrs...)
	a := newClusterClient(t, ms[:1])
	k := uniqueKey(t)
	h := mustAcquire(t, ctx, a.l, k, locker.WithTTL(10*time.Second))
	for _, m := range ms[1:] {
		m.Pause(t)
	}
	resume := sync.OnceFunc(func() {
		for _, m := range ms[1:] {
			m.Resume(t)
		}
		testserver.WaitEtcdLeader(t, ms)
	})
	defer resume()
	// Long enough for the lone member to lose its leader and cancel the
	// watches that require one (3 election timeouts of 1s), short of the
	// holder's lease deadline (9s).
	select {
	case <-h.Done():
		t.Fatalf("the holder reported a loss while its member had no leader: %v", h.Err())
	case <-time.After(5 * time.Second):
	}
	resume()
	if closed(h.Done()) {
		t.Fatalf("the holder reported a loss over the leaderless spell: %v", h.Err())
	}
	if _, err := admin.Delete(ctx, h.(*etcd.Handle).EtcdKey()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Done():
		if !errors.Is(h.Err(), locker.ErrLost) {
			t.Errorf("Err = %v, want ErrLost", h.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the holder did not report the deletion of its key after the cluster healed: its watch was not renewed")
	}
}
