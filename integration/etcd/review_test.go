package etcd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/etcd"
	"github.com/go-locker/locker/integration/testserver"
)

// An Acquire whose create transaction got no answer gives up; its put is
// applied after the clean-up of that Acquire looked for the key and found
// nothing (a request stuck in a slow or paused member). The key, on the
// Locker's lease (which it keeps renewing) and named for this Locker, must
// not stay behind as the oldest waiter of the directory, blocking every
// other contender: the Locker deletes it.
//
// The late application is played by an admin client putting the waiter
// key on A's lease (the name and lease of A's first acquisition: the name
// of slot 0, which the cancelled Acquire used again). A's own create
// transaction was dropped by a blackhole, so its outcome was unknown to A.
func TestLatePutAfterCleanupIsDeleted(t *testing.T) {
	srv := testserver.Etcd(t)
	ctx := testCtx(t, time.Minute)
	admin := newEtcdClient(t, srv.Addr())
	a, b := newClient(t, srv.Addr()), newClient(t, srv.Addr())
	k := uniqueKey(t)
	h := mustAcquire(t, ctx, a.l, k)
	name, lease := h.(*etcd.Handle).EtcdKey(), h.(*etcd.Handle).LeaseID()
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}

	a.px.Blackhole(t)
	actx, cancel := context.WithTimeout(ctx, 400*time.Millisecond)
	_, err := a.l.Acquire(actx, k)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire through a blackhole = %v, want an error wrapping context.DeadlineExceeded", err)
	}
	a.px.Heal(t) // drops what the blackhole held (the create) and resets A's connections
	// A's clean-up of that attempt retries until the server answers. The
	// code before the fix has no signal of its own for that; this pause
	// only lets it show its failure (the fixed Locker deletes the key
	// whether the put lands before or after its clean-up read).
	if _, err := a.l.Inspect(ctx, k); err != nil {
		t.Fatalf("A after the heal: %v", err)
	}
	time.Sleep(time.Second)

	wch := admin.Watch(ctx, name, clientv3.WithFilterPut())
	put, err := admin.Put(ctx, name, "", clientv3.WithLease(lease))
	if err != nil {
		t.Fatalf("the late put: %v", err)
	}
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		for wr := range wch {
			for _, ev := range wr.Events {
				if ev.Kv.ModRevision > put.Header.Revision {
					return
				}
			}
		}
	}()
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatalf("the waiter key %q put late on A's lease was still there 5s later: it blocks the key %q (waiters %v)", name, k, waiterKeys(t, admin, k))
	}
	hb, err := b.l.TryAcquire(ctx, k)
	if err != nil {
		t.Fatalf("TryAcquire by another client after the late key was deleted: %v", err)
	}
	_ = hb.Release(ctx)
	// A still works: its next lock of the key uses another name.
	h2 := mustAcquire(t, ctx, a.l, k)
	_ = h2.Release(ctx)
}

// A member that takes connections but never answers (a blackhole) among
// the client's endpoints (gRPC's keepalive drops it only after 10s or
// more): fresh Lockers granting their leases, taking and releasing locks
// go on through the other endpoints instead of hanging on it or failing
// with the error of the dead one.
func TestGrantAndAcquireAvoidHungEndpoint(t *testing.T) {
	srv := testserver.Etcd(t)
	ctx := testCtx(t, time.Minute)
	hung := testserver.NewProxy(t, srv.Addr())
	ok1, ok2 := testserver.NewProxy(t, srv.Addr()), testserver.NewProxy(t, srv.Addr())
	cli := newEtcdClient(t, hung.Addr(), ok1.Addr(), ok2.Addr())
	// Every endpoint is connected before the one goes silent.
	for range 6 {
		if _, err := cli.Get(ctx, "faults/warm-up"); err != nil {
			t.Fatal(err)
		}
	}
	hung.Blackhole(t)
	defer hung.Heal(t)
	const n = 4
	errs := make(chan error, n)
	for i := range n {
		go func() {
			l := etcd.New(cli)
			defer l.Close()
			actx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			start := time.Now()
			h, err := l.Acquire(actx, uniqueKey(t)+"/"+string(rune('a'+i)), locker.WithTTL(3*time.Second))
			if err != nil {
				errs <- err
				return
			}
			t.Logf("Locker %d acquired after %v", i, time.Since(start))
			errs <- h.Release(ctx)
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("Acquire with one endpoint hung: %v", err)
		}
	}
}

// A Release in flight on a user-owned client while etcd cannot be reached
// ends once Close is done, and a second Close waits for the first.
func TestReleaseAndSecondCloseEndWithClose(t *testing.T) {
	srv := testserver.Etcd(t)
	ctx := testCtx(t, time.Minute)
	a := newClient(t, srv.Addr())
	k := uniqueKey(t)
	h := mustAcquire(t, ctx, a.l, k, locker.WithTTL(ttl))
	a.px.Partition(t)
	defer a.px.Heal(t)
	released := make(chan error, 1)
	go func() { released <- h.Release(context.Background()) }()
	firstDone := make(chan error, 1)
	go func() { firstDone <- a.l.Close() }()
	// Wait until the first Close has begun: new calls fail with ErrClosed.
	for {
		_, err := a.l.TryAcquire(ctx, k)
		if errors.Is(err, locker.ErrClosed) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := a.l.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	select {
	case <-firstDone:
	default:
		t.Error("the second Close returned before the first had finished")
	}
	select {
	case err := <-released:
		t.Logf("Release in flight during Close: %v", err)
		if err == nil {
			t.Error("Release while cut off reported success")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a Release with context.Background was still hanging 2s after Close returned")
	}
}

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
	paused := true
	resume := func() {
		if paused {
			paused = false
			for _, m := range ms[1:] {
				m.Resume(t)
			}
			testserver.WaitEtcdLeader(t, ms)
		}
	}
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
