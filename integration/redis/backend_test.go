package redis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis"
)

func TestOptionsRejected(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	for name, l := range map[string]*redis.Locker{
		"TTL below minimum":   newTestLocker(t, srv.Addr(), redis.WithDefaultTTL(locker.MinTTL/2)),
		"drift over half TTL": newTestLocker(t, srv.Addr(), redis.WithDefaultTTL(time.Second), redis.WithDriftMargin(600*time.Millisecond)),
		"retry interval":      newTestLocker(t, srv.Addr(), redis.WithRetryInterval(0)),
		"nil client":          redis.New(nil),
	} {
		if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, locker.ErrInvalidOption) {
			t.Errorf("%s: TryAcquire: %v, want an error wrapping ErrInvalidOption", name, err)
		}
	}
	l := newTestLocker(t, srv.Addr())
	if _, err := l.TryAcquire(ctx, "k", locker.WithTTL(locker.MinTTL-time.Millisecond)); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("per-call TTL below MinTTL: %v, want an error wrapping ErrInvalidOption", err)
	}
	h, err := l.TryAcquire(ctx, uniqueKey(t), locker.WithTTL(locker.MinTTL))
	if err != nil {
		t.Fatalf("TryAcquire with TTL = MinTTL: %v", err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseOnServer checks what the scripts leave in Redis: the lock with its
// TTL and our owner token, a counter without one, nothing after release.
func TestLeaseOnServer(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	admin := testClient(t, srv.Addr(), true)
	l := newTestLocker(t, srv.Addr(), redis.WithDefaultTTL(5*time.Second))
	key := uniqueKey(t)
	h := mustGet(t, ctx, l, key)
	lock, fence, _ := l.KeyNames(key)
	if owner, err := admin.Get(ctx, lock).Result(); err != nil || owner != h.Owner() {
		t.Errorf("lock value = %q, %v; want the owner token %q", owner, err, h.Owner())
	}
	if pttl := admin.PTTL(ctx, lock).Val(); pttl <= 4*time.Second || pttl > 5*time.Second {
		t.Errorf("PTTL of the lock = %v, want just under 5s", pttl)
	}
	if ttl := admin.PTTL(ctx, fence).Val(); ttl != -1 {
		t.Errorf("PTTL of the fence counter = %v, want -1 (no expiry)", ttl)
	}
	if tok, _ := admin.Get(ctx, fence).Int64(); tok != h.Token() {
		t.Errorf("fence counter = %d, handle token = %d", tok, h.Token())
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := admin.Exists(ctx, lock).Val(); n != 0 {
		t.Errorf("lock still exists after Release")
	}
}

// TestWakeByReleaseAndByExpiry: a waiter is woken by the release
// notification (far sooner than its retry interval or the holder's lease),
// and, when the holder dies, by the holder's lease running out (its PTTL),
// not by the retry interval.
func TestWakeByReleaseAndByExpiry(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	const retry = time.Minute // so that only a notification or PTTL can wake
	admin := testClient(t, srv.Addr(), true)
	holder := newTestLocker(t, srv.Addr(), redis.WithRetryInterval(retry))
	waiter := newTestLocker(t, srv.Addr(), redis.WithRetryInterval(retry))

	t.Run("Release", func(t *testing.T) {
		key := uniqueKey(t)
		h := mustGet(t, ctx, holder, key, locker.WithTTL(30*time.Second))
		got := make(chan time.Time, 1)
		go func() {
			wh, err := waiter.Acquire(ctx, key)
			got <- time.Now()
			if err == nil {
				_ = wh.Release(ctx)
			}
		}()
		// The server is the witness that the waiter listens for the release.
		_, _, wake := waiter.KeyNames(key)
		waitSubscribed(t, ctx, admin, wake)
		released := time.Now()
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		took := (<-got).Sub(released)
		t.Logf("release to handoff: %v", took)
		if took > time.Second {
			t.Errorf("waiter took %v after the release; a notification should wake it within a round trip or two", took)
		}
	})

	t.Run("Expiry", func(t *testing.T) {
		key := uniqueKey(t)
		// The dying holder is another process, with its own connection
		// path through a proxy, so that it can be killed.
		px := testserver.NewProxy(t, srv.Addr())
		dying := newTestLocker(t, px.Addr(), redis.WithRetryInterval(retry))
		const ttl = 1500 * time.Millisecond
		start := time.Now()
		mustGet(t, ctx, dying, key, locker.WithTTL(ttl))
		px.Crash(t) // no release, no renewal: the lease just runs out
		wh := mustGet(t, ctx, waiter, key)
		took := time.Since(start)
		t.Logf("acquired %v after the dead holder's acquire (TTL %v)", took, ttl)
		if took < ttl-50*time.Millisecond || took > ttl+time.Second {
			t.Errorf("waiter got the key %v after a holder with TTL %v died; want about the TTL", took, ttl)
		}
		_ = wh.Release(ctx)
	})
}

// TestClockTokens: tokens are at least the server clock in µs, increase
// strictly, and keep increasing when Lockers with and without the floor
// share a key.
func TestClockTokens(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	admin := testClient(t, srv.Addr(), true)
	clock := newTestLocker(t, srv.Addr(), redis.WithClockTokens(true))
	plain := newTestLocker(t, srv.Addr())
	key := uniqueKey(t)
	now, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	var last int64
	for i, l := range []*redis.Locker{clock, clock, plain, plain, clock, plain} {
		h := mustGet(t, ctx, l, key)
		if h.Token() <= last {
			t.Errorf("acquisition %d: token %d not above %d", i, h.Token(), last)
		}
		if i == 0 && h.Token() < now.UnixMicro() {
			t.Errorf("clock token %d is below the server time %d µs", h.Token(), now.UnixMicro())
		}
		last = h.Token()
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A foreign value in the counter is an error, not a silent overwrite.
	bad := uniqueKey(t)
	badLock, badFence, _ := clock.KeyNames(bad)
	admin.Set(ctx, badFence, "not a number", 0)
	t.Cleanup(func() { admin.Del(context.Background(), badFence) })
	if _, err := clock.TryAcquire(ctx, bad); err == nil || errors.Is(err, locker.ErrNotAcquired) {
		t.Errorf("TryAcquire with a foreign fence value: %v, want a server error", err)
	}
	if n := admin.Exists(ctx, badLock).Val(); n != 0 {
		t.Error("a failed acquire left a lock behind")
	}
}

// TestWatchdogOff: without renewal the lease runs out, and the holder
// knows it before the server frees the key: once another client has got
// the key, the holder's Err reports the loss (Err checks the lease's
// deadline when asked), and Done closes.
//
// It used to compare when the test's goroutine woke from Done with when
// another goroutine's Acquire returned; under CI load (a rehearsal of
// 9b60dc0) the waking came 895µs after, though the deadline had passed
// well before: the order goroutines are scheduled in, not the lease's.
func TestWatchdogOff(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	l := newTestLocker(t, srv.Addr(), redis.WithoutWatchdog(), redis.WithDefaultTTL(time.Second))
	other := newTestLocker(t, srv.Addr())
	key := uniqueKey(t)
	h := mustGet(t, ctx, l, key)
	oh, err := other.Acquire(ctx, key) // once the lease has run out on the server
	if err != nil {
		t.Fatal(err)
	}
	held := h.Err()
	_ = oh.Release(ctx)
	if !errors.Is(held, locker.ErrLost) {
		t.Errorf("once another client got the key, the holder's Err() = %v, want ErrLost", held)
	}
	select {
	case <-h.Done():
	case <-ctx.Done():
		t.Fatal("Done did not close after the loss")
	}
	if err := h.Release(ctx); !errors.Is(err, locker.ErrLost) {
		t.Errorf("Release after expiry: %v, want ErrLost", err)
	}
}

// TestServerRestartWhileHeld: the server restarts while a lock is held.
//
// Without persistence the lock and the fence counter vanish: the holder
// reports the loss at its next renewal, but another client can take the key
// at once, before that, and tokens start again (the failure mode the
// package documentation describes). With the data persisted (here an RDB
// snapshot taken while held) the lock and counter come back: the holder
// keeps the lock and tokens keep rising.
func TestServerRestartWhileHeld(t *testing.T) {
	for _, clock := range []bool{false, true} {
		name := "WithoutPersistence"
		if clock {
			name += "/ClockTokens"
		}
		t.Run(name, func(t *testing.T) {
			srv := testserver.NewRedis(t)
			if !srv.CanControl() {
				t.Skip("needs a server the test controls")
			}
			ctx := testCtx(t)
			const ttl = 2 * time.Second
			holder := newTestLocker(t, srv.Addr(), redis.WithDefaultTTL(ttl), redis.WithClockTokens(clock))
			other := newTestLocker(t, srv.Addr(), redis.WithClockTokens(clock))
			key := uniqueKey(t)
			h := mustGet(t, ctx, holder, key)
			srv.Stop(t)
			srv.Start(t)
			oh := mustGet(t, ctx, other, key)
			select {
			case <-h.Done():
			case <-time.After(2 * ttl):
				t.Fatal("holder did not report the loss after the server lost its lock")
			}
			if !errors.Is(h.Err(), locker.ErrLost) {
				t.Errorf("holder Err() = %v, want ErrLost", h.Err())
			}
			t.Logf("without persistence: token before restart %d, after %d", h.Token(), oh.Token())
			if clock && oh.Token() <= h.Token() {
				t.Errorf("clock tokens went back across a restart without persistence: %d after %d", oh.Token(), h.Token())
			}
			if err := oh.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("WithSnapshot", func(t *testing.T) {
		srv := testserver.NewRedis(t)
		if !srv.CanControl() {
			t.Skip("needs a server the test controls")
		}
		ctx := testCtx(t)
		admin := testClient(t, srv.Addr(), true)
		const ttl = 10 * time.Second
		holder := newTestLocker(t, srv.Addr(), redis.WithDefaultTTL(ttl))
		other := newTestLocker(t, srv.Addr())
		key := uniqueKey(t)
		h := mustGet(t, ctx, holder, key)
		// The test server starts with --appendonly no on its command line,
		// which a restart would restore; a synchronous RDB snapshot stands
		// in for persistence (it is loaded at start, lease expiry included).
		if err := admin.Save(ctx).Err(); err != nil {
			t.Skipf("SAVE: %v", err)
		}
		srv.Stop(t)
		srv.Start(t)
		if _, err := other.TryAcquire(ctx, key); !errors.Is(err, locker.ErrNotAcquired) {
			t.Fatalf("TryAcquire after a restart with persistence: %v, want ErrNotAcquired (the lock survives)", err)
		}
		if err := h.Err(); err != nil {
			t.Errorf("holder lost the lock across a restart shorter than its lease: %v", err)
		}
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		oh := mustGet(t, ctx, other, key)
		if oh.Token() <= h.Token() {
			t.Errorf("token after restart %d is not above %d from before", oh.Token(), h.Token())
		}
		_ = oh.Release(ctx)
	})
}

// TestPausedServerLongerThanTTL: the server freezes for longer than the TTL.
// The holder reports the loss before anyone else can take the key, which
// is possible only once the server thaws.
func TestPausedServerLongerThanTTL(t *testing.T) {
	srv := testserver.NewRedis(t)
	if !srv.CanControl() {
		t.Skip("needs a server the test controls")
	}
	ctx := testCtx(t)
	const ttl = time.Second
	holder := newTestLocker(t, srv.Addr(), redis.WithDefaultTTL(ttl))
	other := newTestLocker(t, srv.Addr())
	key := uniqueKey(t)
	h := mustGet(t, ctx, holder, key)
	srv.Pause(t)
	paused := time.Now()
	select {
	case <-h.Done():
	case <-time.After(3 * ttl):
		srv.Resume(t)
		t.Fatal("holder did not report the loss while the server was paused")
	}
	lost := time.Now()
	if !errors.Is(h.Err(), locker.ErrLost) {
		t.Errorf("Err() = %v, want ErrLost", h.Err())
	}
	if d := lost.Sub(paused); d > ttl {
		t.Errorf("loss reported %v after the pause, later than the TTL %v", d, ttl)
	}
	time.Sleep(ttl) // paused well past the TTL
	srv.Resume(t)
	oh := mustGet(t, ctx, other, key)
	if oh.Token() <= h.Token() {
		t.Errorf("token after the pause %d is not above the lost holder's %d", oh.Token(), h.Token())
	}
	_ = oh.Release(ctx)
}

// TestCloseDoesNotCloseClient: a Locker made with New leaves the caller's
// client open.
func TestCloseDoesNotCloseClient(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	c := testClient(t, srv.Addr(), false)
	l := redis.New(c)
	mustGet(t, ctx, l, uniqueKey(t))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Errorf("client unusable after Locker.Close: %v", err)
	}
	var _ goredis.UniversalClient = c
}

// TestWaiterSurvivesPubSubReconnect: the waiter's connections are reset
// while it waits; go-redis reconnects and resubscribes, and a later release
// still wakes the waiter by notification, not by its retry interval.
func TestWaiterSurvivesPubSubReconnect(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	admin := testClient(t, srv.Addr(), true)
	px := testserver.NewProxy(t, srv.Addr())
	const retry = time.Minute
	// The waiter's connections carry a name, so that the server can tell
	// them apart from the others.
	name := "waiter-" + randomID()
	wc := goredis.NewClient(&goredis.Options{Addr: px.Addr(), ClientName: name, ContextTimeoutEnabled: true,
		DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = wc.Close() })
	waiter := redis.New(wc, redis.WithRetryInterval(retry))
	t.Cleanup(func() { _ = waiter.Close() })
	holder := newTestLocker(t, srv.Addr())
	key := uniqueKey(t)
	_, _, wake := waiter.KeyNames(key)
	h := mustGet(t, ctx, holder, key, locker.WithTTL(time.Minute))
	got := make(chan time.Time, 1)
	go func() {
		wh, err := waiter.Acquire(ctx, key)
		got <- time.Now()
		if err != nil {
			t.Errorf("waiting Acquire: %v", err)
			return
		}
		_ = wh.Release(ctx)
	}()
	// The server is the witness: the waiter is subscribed before the reset,
	// and subscribed again, on a new connection, before the release.
	waitSubscribed(t, ctx, admin, wake)
	old := pubSubClients(t, ctx, admin, name)
	if len(old) == 0 {
		t.Fatalf("no subscribed connection named %q on the server", name)
	}
	px.ResetAll(t)
	reset := time.Now()
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	waitResubscribed(t, rctx, admin, name, old, wake)
	t.Logf("resubscribed %v after the reset", time.Since(reset))
	released := time.Now()
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-got:
		t.Logf("woken %v after the release", at.Sub(released))
		if d := at.Sub(released); d > 2*time.Second {
			t.Errorf("waiter woke %v after the release; the resubscription did not work", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not woken within 10s of the release after a reconnect")
	}
}

// TestReleaseWithEndedContext: a Release whose context has already ended
// reports the context error, gives the lock up, and still deletes it in the
// background, so others need not wait for the TTL.
func TestReleaseWithEndedContext(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	l := newTestLocker(t, srv.Addr())
	other := newTestLocker(t, srv.Addr())
	key := uniqueKey(t)
	h := mustGet(t, ctx, l, key, locker.WithTTL(time.Minute))
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := h.Release(done); !errors.Is(err, context.Canceled) {
		t.Errorf("Release with a cancelled context: %v, want context.Canceled", err)
	}
	if !errors.Is(h.Err(), locker.ErrReleased) {
		t.Errorf("Err() = %v, want ErrReleased", h.Err())
	}
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	oh, err := other.Acquire(wctx, key)
	if err != nil {
		t.Fatalf("key not freed in the background: %v", err)
	}
	_ = oh.Release(ctx)
}

// TestConcurrentRelease: of many concurrent Releases exactly one succeeds.
func TestConcurrentRelease(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	l := newTestLocker(t, srv.Addr())
	h := mustGet(t, ctx, l, uniqueKey(t))
	errs := make(chan error, 8)
	for range cap(errs) {
		go func() { errs <- h.Release(ctx) }()
	}
	ok := 0
	for range cap(errs) {
		switch err := <-errs; {
		case err == nil:
			ok++
		case !errors.Is(err, locker.ErrReleased):
			t.Errorf("concurrent Release: %v, want nil or ErrReleased", err)
		}
	}
	if ok != 1 {
		t.Errorf("%d Releases succeeded, want exactly 1", ok)
	}
}

// TestAcquireAbandonedInFlight: with a client that ignores contexts during
// socket I/O, an Acquire whose request hangs (blackholed connection) still
// returns when its context ends; the request finishes in the background and
// Close waits for it. The lock it may have taken is cleaned up after heal.
func TestAcquireAbandonedInFlight(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	px := testserver.NewProxy(t, srv.Addr())
	l := redis.New(testClient(t, px.Addr(), false))
	key := uniqueKey(t)
	// Warm the connection so the blackhole catches a request, not a dial.
	if h, err := l.TryAcquire(ctx, key+"/warm"); err == nil {
		_ = h.Release(ctx)
	}
	px.Blackhole(t)
	actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := l.Acquire(actx, key)
	if took := time.Since(start); took > time.Second {
		t.Errorf("Acquire returned %v after its context ended", took-200*time.Millisecond)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire on a blackholed server: %v, want context.DeadlineExceeded", err)
	}
	px.Heal(t)
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	select {
	case <-closed:
	case <-time.After(15 * time.Second):
		t.Fatal("Close did not return")
	}
	other := newTestLocker(t, srv.Addr())
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	oh, err := other.Acquire(wctx, key)
	if err != nil {
		t.Fatalf("key blocked after an abandoned Acquire: %v", err)
	}
	_ = oh.Release(ctx)
}

// TestCloseWhileCutNoReadTimeout: Close of a Locker that holds a lock, on
// a plain client (no ContextTimeoutEnabled) without any read timeout, while
// the server does not answer, returns within locker.ReleaseTimeout: its
// releases go through the inline clone's short socket timeout and then off
// the caller's goroutine, never through a read that nothing ends.
func TestCloseWhileCutNoReadTimeout(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	px := testserver.NewProxy(t, srv.Addr())
	c := goredis.NewClient(&goredis.Options{Addr: px.Addr(), ReadTimeout: -1, WriteTimeout: -1, DialTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	l := redis.New(c)
	h := mustGet(t, ctx, l, uniqueKey(t))
	px.Blackhole(t)
	closed := make(chan error, 1)
	start := time.Now()
	go func() { closed <- l.Close() }()
	select {
	case err := <-closed:
		t.Logf("Close returned after %v: %v", time.Since(start), err)
		if err == nil {
			t.Error("Close reported no error for a release the server never answered")
		}
	case <-time.After(locker.ReleaseTimeout + 3*time.Second):
		t.Fatalf("Close did not return within %v of a cut", locker.ReleaseTimeout+3*time.Second)
	}
	// The lock Close could not release is not released: it stays on the
	// server until its lease ends (the interface's Close doc).
	if err := h.Err(); !errors.Is(err, locker.ErrLost) || !errors.Is(err, locker.ErrClosed) || errors.Is(err, locker.ErrReleased) {
		t.Errorf("held lock after a Close that could not reach the server: %v, want an error wrapping ErrLost and ErrClosed, not ErrReleased", err)
	}
	px.Heal(t)
}

// TestCutHolderLosesFirst: a holder cut off from Redis hears of the loss
// before a client that is waiting for the key gets it.
func TestCutHolderLosesFirst(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	admin := testClient(t, srv.Addr(), true)
	px := testserver.NewProxy(t, srv.Addr())
	const ttl = time.Second
	holder := newTestLocker(t, px.Addr(), redis.WithDefaultTTL(ttl))
	other := newTestLocker(t, srv.Addr())
	key := uniqueKey(t)
	h := mustGet(t, ctx, holder, key)
	got := make(chan time.Time, 1)
	go func() {
		oh, err := other.Acquire(ctx, key)
		got <- time.Now()
		if err == nil {
			_ = oh.Release(ctx)
		}
	}()
	_, _, wake := other.KeyNames(key)
	waitSubscribed(t, ctx, admin, wake) // the other client waits for the key
	px.Blackhole(t)
	cut := time.Now()
	<-h.Done()
	lost := time.Now()
	acquired := <-got
	t.Logf("cut → loss reported %v, cut → other holds %v", lost.Sub(cut), acquired.Sub(cut))
	if !errors.Is(h.Err(), locker.ErrLost) {
		t.Errorf("Err() = %v, want ErrLost", h.Err())
	}
	if !lost.Before(acquired) {
		t.Errorf("the other client got the key %v before the cut-off holder heard of the loss", lost.Sub(acquired))
	}
	px.Heal(t)
}

// TestWatchdogUnderLatency: renewals that take a fifth of the TTL still keep
// the lock for several TTLs (the lease is measured from when each renewal
// was sent); a delay longer than the TTL loses it, before anyone else can
// get it.
func TestWatchdogUnderLatency(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	const ttl = time.Second
	key := uniqueKey(t)
	px := testserver.NewProxy(t, srv.Addr())
	holder := newTestLocker(t, px.Addr(), redis.WithDefaultTTL(ttl))
	other := newTestLocker(t, srv.Addr())
	h := mustGet(t, ctx, holder, key)
	px.Latency(t, ttl/5)
	time.Sleep(3 * ttl)
	if err := h.Err(); err != nil {
		t.Fatalf("lost the lock with renewals slowed to TTL/5: %v", err)
	}
	mustNotTry := func() {
		if _, err := other.TryAcquire(ctx, key); !errors.Is(err, locker.ErrNotAcquired) {
			t.Errorf("TryAcquire while held: %v, want ErrNotAcquired", err)
		}
	}
	mustNotTry()

	px.Latency(t, 2*ttl)
	got := make(chan time.Time, 1)
	go func() {
		oh, err := other.Acquire(ctx, key)
		got <- time.Now()
		if err == nil {
			_ = oh.Release(ctx)
		}
	}()
	select {
	case <-h.Done():
	case <-time.After(3 * ttl):
		t.Fatal("no loss reported with renewals slower than the TTL")
	}
	lost := time.Now()
	if acquired := <-got; !lost.Before(acquired) {
		t.Errorf("the other client got the key %v before the slowed holder heard of the loss", lost.Sub(acquired))
	}
	px.Heal(t)
}
