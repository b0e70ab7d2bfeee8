package etcd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
)

// closeUnreachable closes l, which holds h, while its server cannot be
// reached (how says why): Close must return within locker.ReleaseTimeout,
// say which lock it could not release (an error wrapping ErrLost) and end
// the handle.
func closeUnreachable(t *testing.T, l locker.Locker, h locker.Handle, how string) {
	t.Helper()
	start := time.Now()
	err := l.Close()
	took := time.Since(start)
	t.Logf("Close %s took %v: %v", how, took, err)
	if took > locker.ReleaseTimeout {
		t.Errorf("Close %s took %v, more than locker.ReleaseTimeout (%v)", how, took, locker.ReleaseTimeout)
	}
	if !errors.Is(err, locker.ErrLost) {
		t.Errorf("Close %s = %v, want an error wrapping ErrLost naming the lock it could not release", how, err)
	}
	if !closed(h.Done()) {
		t.Errorf("Close %s returned with the handle still open", how)
	}
}

// Close while etcd cannot be reached returns within its bound and says
// which locks it could not release.
func TestCloseWhileDown(t *testing.T) {
	srv := testserver.Etcd(t)
	ctx := testCtx(t, time.Minute)
	a, b := newClient(t, srv.Addr()), newClient(t, srv.Addr())
	k := uniqueKey(t)
	h := mustAcquire(t, ctx, a.l, k, locker.WithTTL(ttl))
	a.px.Partition(t)
	defer a.px.Heal(t)
	closeUnreachable(t, a.l, h, "while cut off")
	// The key frees when the unrenewed lease expires.
	h2 := mustAcquire(t, testCtx(t, 4*ttl), b.l, k)
	_ = h2.Release(ctx)
}

// Close while the (single) member is stopped — its port closed, not a
// partition — returns within locker.ReleaseTimeout, ends the handle and
// says which lock it could not release; once the server is back the key
// frees when the unrenewed lease expires.
func TestCloseWhileServerStopped(t *testing.T) {
	srv := testserver.NewEtcd(t)
	if !srv.CanControl() {
		t.Skip("the server is not a container the test can stop")
	}
	ctx := testCtx(t, 2*time.Minute)
	a := newClient(t, srv.Addr())
	k := uniqueKey(t)
	h := mustAcquire(t, ctx, a.l, k, locker.WithTTL(ttl))
	srv.Stop(t)
	closeUnreachable(t, a.l, h, "with etcd stopped")
	srv.Start(t)
	b := newClient(t, srv.Addr())
	h2 := mustAcquire(t, testCtx(t, 30*time.Second), b.l, k)
	_ = h2.Release(ctx)
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
	// The first Close's goroutine sends its result only after Close has
	// returned, a moment after the second Close is let go: allow it that
	// moment, far less than the first Close spends on the cut-off release
	// (about ReleaseTimeout), which a second Close that did not wait
	// would return well within.
	select {
	case <-firstDone:
	case <-time.After(time.Second):
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
