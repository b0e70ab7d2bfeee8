package etcd_test

import (
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/etcd"
	"github.com/go-locker/locker/integration/testserver"
)

// A holder whose renewals reach the server but whose answers come too late
// reports the loss by its own clock while the server still keeps the
// lease; the Locker then revokes that lease, a drift margin later, so the
// next contender gets the key that soon instead of a TTL later.
func TestLossRevokesLease(t *testing.T) {
	const ttl = 3 * time.Second
	srv := testserver.Etcd(t)
	ctx := testCtx(t, time.Minute)
	a, b := newClient(t, srv.Addr()), newClient(t, srv.Addr())
	k := uniqueKey(t)
	h := mustAcquire(t, ctx, a.l, k, locker.WithTTL(ttl))
	a.px.Latency(t, 1500*time.Millisecond) // above the renewal bound (TTL/3)
	defer a.px.Heal(t)
	other := goAcquire(ctx, b.l, k, locker.WithTTL(ttl))
	var lostAt time.Time
	select {
	case <-h.Done():
		lostAt = time.Now()
	case r := <-other:
		t.Fatalf("B acquired (err %v) before A reported the loss", r.err)
	case <-time.After(3 * ttl):
		t.Fatal("A never reported the loss")
	}
	if !errors.Is(h.Err(), locker.ErrLost) {
		t.Fatalf("A's Err = %v, want ErrLost", h.Err())
	}
	select {
	case r := <-other:
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Logf("B acquired %v after A reported the loss", r.at.Sub(lostAt))
		if d := r.at.Sub(lostAt); d > ttl/2 {
			t.Errorf("B acquired %v after A's loss: the lost lease was not revoked (the server expired it)", d)
		} else if d < ttl/10/2 {
			// The revoke waits the drift margin (TTL/10): A's process
			// keeps the reaction time the server's expiry would give it.
			t.Errorf("B acquired %v after A's loss: the lease was revoked without leaving A the drift margin (%v)", d, ttl/10)
		}
		_ = r.h.Release(ctx)
	case <-time.After(3 * ttl):
		t.Fatal("B never acquired")
	}
}

// A lease for a TTL other than the Locker's default is revoked once unused
// for one TTL; one used again within that time is reused; one held, or
// waited on, for longer than that is kept; the default TTL's lease is kept.
// Without the retirement a Locker given many TTLs renewed a lease for each
// of them until Close.
func TestIdleLeaseRetired(t *testing.T) {
	const ttl = 2 * time.Second // the TTL whose lease retires; lingers 2s
	srv := testserver.Etcd(t)
	ctx := testCtx(t, 2*time.Minute)
	c := newClient(t, srv.Addr(), etcd.WithDefaultTTL(5*time.Second))
	other := newClient(t, srv.Addr())
	k := uniqueKey(t)
	alive := func(id clientv3.LeaseID) bool {
		t.Helper()
		r, err := c.cli.TimeToLive(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return r.TTL > 0
	}
	release := func(h locker.Handle) clientv3.LeaseID {
		t.Helper()
		id := h.(*etcd.Handle).LeaseID()
		if err := h.Err(); err != nil {
			t.Fatalf("lock on lease %x lost: %v", id, err)
		}
		if !alive(id) {
			t.Fatalf("lease %x of a live lock is gone", id)
		}
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		return id
	}
	// Passing the time the test is about: longer than the linger.
	beyondLinger := func() { time.Sleep(ttl + 1500*time.Millisecond) }

	def := release(mustAcquire(t, ctx, c.l, k))
	// Held for longer than the linger: kept.
	h := mustAcquire(t, ctx, c.l, k, locker.WithTTL(ttl))
	beyondLinger()
	short := release(h)
	if short == def {
		t.Fatal("the default TTL and another share a lease")
	}
	// Used again at once: the same lease.
	if again := release(mustAcquire(t, ctx, c.l, k, locker.WithTTL(ttl))); again != short {
		t.Fatalf("a lease used again at once was replaced (%x, then %x)", short, again)
	}
	// A waiter for longer than the linger keeps it too.
	blocker := mustAcquire(t, ctx, other.l, k)
	got := goAcquire(ctx, c.l, k, locker.WithTTL(ttl))
	for len(waiterKeys(t, c.cli, k)) < 2 {
		time.Sleep(10 * time.Millisecond) // polling the server: no event to wait on
	}
	beyondLinger()
	if err := blocker.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("the waiter on the short TTL's lease: %v", r.err)
	}
	if id := release(r.h); id != short {
		t.Fatalf("the waiter's lock is on lease %x, not the lease it waited on (%x)", id, short)
	}
	// Unused: revoked after its linger. It would live on if renewed, so
	// its end on the server proves it.
	deadline := time.Now().Add(ttl + 5*time.Second)
	for alive(short) {
		if time.Now().After(deadline) {
			t.Fatalf("the lease of an unused TTL is still alive %v after its last use", ttl+5*time.Second)
		}
		time.Sleep(100 * time.Millisecond) // polling the server: no event to wait on
	}
	if !alive(def) {
		t.Fatal("the default TTL's lease was not kept")
	}
	// The next lock of that TTL gets a fresh lease and works.
	if fresh := release(mustAcquire(t, ctx, c.l, k, locker.WithTTL(ttl))); fresh == short {
		t.Fatalf("after retirement the lock is on the retired lease %x", fresh)
	}
}
