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
