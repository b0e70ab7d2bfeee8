package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/postgres"
)

// A server restart ends every session; the holder hears of it at once (the
// server's FATAL message wakes the health monitor), not a check later.
func TestServerRestartEndsHold(t *testing.T) {
	srv := testserver.NewPostgres(t)
	if !srv.CanControl() {
		t.Skipf("needs a server the test may restart; %s is not", srv)
	}
	ctx := testCtx(t)
	pool := newPool(t, srv.DSN(), 4)
	l := newLocker(t, pool, postgres.WithHealthCheckInterval(time.Minute))
	k := testKey(t, "")
	h := mustAcquire(t, ctx, l, k)
	stopping := time.Now()
	doneAt := make(chan time.Time, 1)
	go func() { <-h.Done(); doneAt <- time.Now() }()
	srv.Stop(t)
	stopped := time.Since(stopping)
	waitDone(t, h, 10*time.Second, "holder whose server stopped")
	t.Logf("Done() closed %v after Stop began (Stop took %v; check interval 1m)", (<-doneAt).Sub(stopping), stopped)
	if !errors.Is(h.Err(), locker.ErrLost) {
		t.Fatalf("Err() = %v, want ErrLost", h.Err())
	}
	srv.Start(t)
	// The Locker never pretends: the handle stays lost, and the key is free.
	if err := h.Release(ctx); !errors.Is(err, locker.ErrLost) {
		t.Errorf("Release after restart: %v, want ErrLost", err)
	}
	h2 := mustAcquire(t, ctx, l, k)
	if h2.Token() <= h.Token() {
		t.Errorf("token %d after restart not greater than %d", h2.Token(), h.Token())
	}
	mustRelease(t, ctx, h2)
}

// pg_terminate_backend frees the lock on the server at once; the holder's
// monitor reads the FATAL message and reports the loss without waiting for a
// health check.
func TestTerminatedBackend(t *testing.T) {
	ctx := testCtx(t)
	pool := sharedPool(t, 4)
	l := newLocker(t, pool, postgres.WithHealthCheckInterval(time.Minute))
	k := testKey(t, "")
	h := mustAcquire(t, ctx, l, k)
	pid := holderPID(t, ctx, pool, k) // the holder's session, as pg_locks shows it
	var ok bool
	if err := pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
	}
	took := waitDone(t, h, 5*time.Second, "holder whose backend was terminated")
	t.Logf("Done() closed %v after pg_terminate_backend (check interval 1m)", took)
	if !errors.Is(h.Err(), locker.ErrLost) {
		t.Fatalf("Err() = %v, want ErrLost", h.Err())
	}
	// The client reads the FATAL message before the server has finished
	// ending the backend (and with it the advisory lock): wait for the
	// backend to be gone, then the key must be free at the first try.
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("backend %d still in pg_stat_activity 5s after pg_terminate_backend", pid)
		}
	}
	other := newLocker(t, pool)
	h2, err := other.TryAcquire(ctx, k)
	if err != nil {
		t.Fatalf("TryAcquire after the holder's backend was terminated: %v", err)
	}
	if h2.Token() <= h.Token() {
		t.Errorf("token %d not greater than the terminated holder's %d", h2.Token(), h.Token())
	}
	mustRelease(t, ctx, h2)
}

// A connection reset (the proxy drops every connection) ends the hold at once.
func TestConnectionReset(t *testing.T) {
	srv := testserver.Postgres(t)
	px := testserver.NewProxy(t, srv.Addr())
	ctx := testCtx(t)
	l := newLocker(t, newPool(t, withHost(t, srv.DSN(), px.Addr(), nil), 4), postgres.WithHealthCheckInterval(time.Minute))
	h := mustAcquire(t, ctx, l, testKey(t, ""))
	px.ResetAll(t)
	took := waitDone(t, h, 5*time.Second, "holder whose connection was reset")
	t.Logf("Done() closed %v after the reset", took)
	if !errors.Is(h.Err(), locker.ErrLost) {
		t.Fatalf("Err() = %v, want ErrLost", h.Err())
	}
}

// A frozen server (docker pause) does not answer the health check: the holder
// reports the loss within about two intervals and closes its connection, and
// once the server runs again it sees the close and frees the key.
func TestServerPauseLosesLock(t *testing.T) {
	srv := testserver.NewPostgres(t)
	if !srv.CanControl() {
		t.Skipf("needs a server the test may pause; %s is not", srv)
	}
	ctx := testCtx(t)
	l := newLocker(t, newPool(t, srv.DSN(), 4))
	k := testKey(t, "")
	h := mustAcquire(t, ctx, l, k)
	srv.Pause(t)
	took := waitDone(t, h, 4*testInterval+5*time.Second, "holder whose server froze")
	srv.Resume(t)
	t.Logf("Done() closed %v after the pause (interval %v)", took, testInterval)
	if !errors.Is(h.Err(), locker.ErrLost) {
		t.Fatalf("Err() = %v, want ErrLost", h.Err())
	}
	other := newLocker(t, newPool(t, srv.DSN(), 4))
	h2 := mustAcquire(t, ctx, other, k)
	if h2.Token() <= h.Token() {
		t.Errorf("token %d not greater than %d", h2.Token(), h.Token())
	}
	mustRelease(t, ctx, h2)
}

// The bounds of giving up a wait on a dead link, which the tests below hold
// the Locker to: Acquire returns "after at most a second" once its context
// ended (package documentation), past which it closes the connection; Close,
// which waits for that cleanup, also allows delivering the cancel request
// (2s) and a cleanup statement (1s).
const (
	deadLinkAbandon = time.Second
	deadLinkClose   = 2*time.Second + time.Second
)

// A wait cancelled while the link is dead (no cancel request can get
// through) still returns promptly, and Close still ends in bounded time.
func TestCancelOnDeadLink(t *testing.T) {
	srv := testserver.Postgres(t)
	px := testserver.NewProxy(t, srv.Addr())
	ctx := testCtx(t)
	holderPool := sharedPool(t, 2) // one connection for the lock, one to look at pg_locks
	holder := newLocker(t, holderPool)
	waiter := newLocker(t, newPool(t, withHost(t, srv.DSN(), px.Addr(), nil), 2))
	k := testKey(t, "")
	h := mustAcquire(t, ctx, holder, k)
	wctx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(wctx, k)
		got <- err
	}()
	waitQueued(t, ctx, holderPool, k, 1)
	px.Blackhole(t)
	cancelled := time.Now()
	cancel()
	err := <-got
	took := time.Since(cancelled)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire on a dead link: %v", err)
	}
	if took > deadLinkAbandon+2*time.Second {
		t.Errorf("cancelled Acquire on a dead link returned after %v, want about %v", took, deadLinkAbandon)
	}
	t.Logf("returned %v after its context ended", took)
	closing := time.Now()
	waiter.Close()
	d := time.Since(closing)
	t.Logf("Close took %v", d)
	if d > deadLinkClose+2*time.Second {
		t.Errorf("Close took %v", d)
	}
	px.Heal(t)
	mustRelease(t, ctx, h)
}

// locker.Do on this backend: when the session is killed while fn runs, fn's
// context ends with a cause wrapping ErrLost, and Do reports the loss.
func TestDoStopsOnLoss(t *testing.T) {
	ctx := testCtx(t)
	pool := sharedPool(t, 4)
	l := newLocker(t, pool)
	k := testKey(t, "")
	err := locker.Do(ctx, l, k, func(fctx context.Context, _ locker.Handle) error {
		pid := holderPID(t, ctx, pool, k)
		if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
			return err
		}
		select {
		case <-fctx.Done():
			if !errors.Is(context.Cause(fctx), locker.ErrLost) {
				t.Errorf("fn's context ended with cause %v, want ErrLost", context.Cause(fctx))
			}
			return nil
		case <-time.After(5 * time.Second):
			return errors.New("fn's context not cancelled after its lock was lost")
		}
	})
	if !errors.Is(err, locker.ErrLost) {
		t.Fatalf("Do: %v, want ErrLost", err)
	}
}

// A Release whose unlock gets no answer (the link died after the lock was
// taken) returns after locker.ReleaseTimeout with the lock reported lost,
// having closed its connection; once the link is back, the server ends that
// session and the key is free again.
func TestReleaseOnDeadLinkIsBounded(t *testing.T) {
	srv := testserver.Postgres(t)
	px := testserver.NewProxy(t, srv.Addr())
	ctx := testCtx(t)
	// A long interval: the monitor waits on the socket, so Release wakes it
	// and sends the unlock itself.
	l := newLocker(t, newPool(t, withHost(t, srv.DSN(), px.Addr(), nil), 2), postgres.WithHealthCheckInterval(time.Minute))
	other := newLocker(t, sharedPool(t, 2))
	k := testKey(t, "")
	h := mustAcquire(t, ctx, l, k)
	px.Blackhole(t)
	start := time.Now()
	err := h.Release(context.Background())
	took := time.Since(start)
	t.Logf("Release returned after %v: %v", took, err)
	if !errors.Is(err, locker.ErrLost) {
		t.Fatalf("Release with no answer: %v, want ErrLost", err)
	}
	if took < locker.ReleaseTimeout-time.Second || took > locker.ReleaseTimeout+3*time.Second {
		t.Errorf("Release with no answer returned after %v, want about locker.ReleaseTimeout (%v)", took, locker.ReleaseTimeout)
	}
	if !errors.Is(h.Err(), locker.ErrLost) {
		t.Errorf("Err after the bounded Release: %v, want ErrLost", h.Err())
	}
	px.Heal(t)
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	h2, err := other.Acquire(actx, k)
	if err != nil {
		t.Fatalf("the key was not freed after the link came back: %v", err)
	}
	mustRelease(t, ctx, h2)
}
