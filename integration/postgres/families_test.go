package postgres_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/postgres"
)

// The lock families' own windows (postgres/families.go): the order of the
// queue across the slices of a wait, a waiter or holder whose session the
// server ends or that goes silent, and what a cancelled wait leaves on its
// connection. Conformance's Semaphore/*, RW/* and Families/* cases run in
// TestConformance.

// sliceInterval is the health-check interval, and so the slice of a wait,
// of the tests that watch a queue across slices.
// It is testInterval: shorter slices have the backstop (no answer within
// two slices) fire on a loaded machine under -race.
const sliceInterval = testInterval

type acquired struct {
	h   locker.Handle
	err error
	at  time.Time
}

// goAcquire runs acquire in a goroutine; its result arrives on the channel.
func goAcquire(ctx context.Context, acquire func(context.Context) (locker.Handle, error)) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		h, err := acquire(ctx)
		ch <- acquired{h, err, time.Now()}
	}()
	return ch
}

// participants counts the sessions that hold the member lock m of a
// family's key (postgres.SemaphoreKey, postgres.ReadWriteKey): its holders
// and waiters.
func participants(t testing.TB, ctx context.Context, pool *pgxpool.Pool, m int64) int {
	t.Helper()
	u := uint64(m)
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT pid) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1`, int64(u>>32), int64(u&0xFFFFFFFF)).Scan(&n); err != nil {
		t.Fatalf("pg_locks: %v", err)
	}
	return n
}

// waitParticipants waits until n sessions take part in the family lock
// whose member lock is m: the sign that a waiter has joined the queue.
func waitParticipants(t testing.TB, ctx context.Context, pool *pgxpool.Pool, m int64, n int) {
	t.Helper()
	waitParticipantsWithin(t, ctx, pool, m, n, 10*time.Second)
}

// waitParticipantsWithin waits until n sessions take part in the family
// lock whose member lock is m, failing the test after within.
func waitParticipantsWithin(t testing.TB, ctx context.Context, pool *pgxpool.Pool, m int64, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := participants(t, ctx, pool, m)
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions take part in the lock after %v, want %d", got, within, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// mustGet waits up to within for an acquisition that must succeed.
func mustGet(t testing.TB, ch <-chan acquired, within time.Duration, what string) acquired {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r
	case <-time.After(within):
		t.Fatalf("%s: not granted within %v", what, within)
		return acquired{}
	}
}

// notYet fails the test if any of chs delivers within d.
func notYet(t testing.TB, d time.Duration, chs map[string]<-chan acquired) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		for what, ch := range chs {
			select {
			case r := <-ch:
				if r.err == nil {
					_ = r.h.Release(context.Background())
				}
				t.Fatalf("%s returned out of turn (%v)", what, r.err)
			default:
			}
		}
		select {
		case <-timer.C:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// A reader-writer lock is first come, first served across the slices of
// the waits: each waiter's statement ends on the server every slice (its
// lock_timeout) and starts again, yet nobody overtakes anybody, and
// TryAcquireRead keeps failing while a writer waits. PostgreSQL's own
// queue would not do this: a waiter that leaves it at a slice's end lets
// the readers queued behind it in and joins again at the back (seen with
// psql on PostgreSQL 15: a reader queued behind a writer whose
// lock_timeout fired was granted in that instant), so a writer waiting
// behind overlapping readers that hold longer than a slice would never get
// its turn.
func TestRWOrderSurvivesSlices(t *testing.T) {
	ctx := testCtx(t)
	pool := sharedPool(t, 8)
	l := newLocker(t, pool, postgres.WithHealthCheckInterval(sliceInterval))
	k := testKey(t, "")
	m := postgres.ReadWriteKey("", k)

	r1, err := l.TryAcquireRead(ctx, k)
	if err != nil {
		t.Fatalf("TryAcquireRead of a free key: %v", err)
	}
	w1 := goAcquire(ctx, func(ctx context.Context) (locker.Handle, error) { return l.AcquireWrite(ctx, k) })
	waitParticipants(t, ctx, pool, m, 2)
	r2 := goAcquire(ctx, func(ctx context.Context) (locker.Handle, error) { return l.AcquireRead(ctx, k) })
	waitParticipants(t, ctx, pool, m, 3)
	w2 := goAcquire(ctx, func(ctx context.Context) (locker.Handle, error) { return l.AcquireWrite(ctx, k) })
	waitParticipants(t, ctx, pool, m, 4)

	// Four slices of every wait, and a reader trying all along.
	end := time.Now().Add(4 * sliceInterval)
	tries := 0
	for time.Now().Before(end) {
		if h, err := l.TryAcquireRead(ctx, k); !errors.Is(err, locker.ErrNotAcquired) {
			if err == nil {
				_ = h.Release(ctx)
			}
			t.Fatalf("TryAcquireRead while a writer waits, after %d tries: %v, want ErrNotAcquired", tries, err)
		}
		tries++
		notYet(t, 10*time.Millisecond, map[string]<-chan acquired{"the first writer": w1, "the reader behind it": r2, "the second writer": w2})
	}
	t.Logf("%d TryAcquireRead refused over %v of waits in slices of %v", tries, 4*sliceInterval, sliceInterval)

	mustRelease(t, ctx, r1)
	gw1 := mustGet(t, w1, 2*time.Second, "the first writer after the first reader left")
	notYet(t, 2*sliceInterval, map[string]<-chan acquired{"the reader behind the first writer": r2, "the second writer": w2})
	mustRelease(t, ctx, gw1.h)
	gr2 := mustGet(t, r2, 2*time.Second, "the reader after the first writer left")
	notYet(t, 2*sliceInterval, map[string]<-chan acquired{"the second writer": w2})
	mustRelease(t, ctx, gr2.h)
	gw2 := mustGet(t, w2, 2*time.Second, "the second writer after the reader left")
	mustRelease(t, ctx, gw2.h)

	toks := []int64{r1.Token(), gw1.h.Token(), gr2.h.Token(), gw2.h.Token()}
	for i := 1; i < len(toks); i++ {
		if toks[i] <= toks[i-1] {
			t.Errorf("tokens in the order of the grants: %v, want strictly increasing", toks)
		}
	}
}

// A semaphore is first come, first served too, across slices: three
// waiters queued behind two held permits get them in the order they came,
// one per release, while TryAcquireSemaphore fails and a different limit is
// refused because of the waiters alone.
func TestSemaphoreOrderSurvivesSlices(t *testing.T) {
	ctx := testCtx(t)
	pool := sharedPool(t, 8)
	l := newLocker(t, pool, postgres.WithHealthCheckInterval(sliceInterval))
	k := testKey(t, "")
	m := postgres.SemaphoreKey("", k)
	acq := func(ctx context.Context) (locker.Handle, error) { return l.AcquireSemaphore(ctx, k, 2) }

	h1, err := l.TryAcquireSemaphore(ctx, k, 2)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := l.TryAcquireSemaphore(ctx, k, 2)
	if err != nil {
		t.Fatal(err)
	}
	a := goAcquire(ctx, acq)
	waitParticipants(t, ctx, pool, m, 3)
	b := goAcquire(ctx, acq)
	waitParticipants(t, ctx, pool, m, 4)
	c := goAcquire(ctx, acq)
	waitParticipants(t, ctx, pool, m, 5)

	end := time.Now().Add(4 * sliceInterval)
	for time.Now().Before(end) {
		if h, err := l.TryAcquireSemaphore(ctx, k, 2); !errors.Is(err, locker.ErrNotAcquired) {
			if err == nil {
				_ = h.Release(ctx)
			}
			t.Fatalf("TryAcquireSemaphore while both permits are held and three wait: %v, want ErrNotAcquired", err)
		}
		notYet(t, 10*time.Millisecond, map[string]<-chan acquired{"waiter A": a, "waiter B": b, "waiter C": c})
	}

	// Only waiters, no holder, with another limit: still refused.
	mustRelease(t, ctx, h1)
	ga := mustGet(t, a, 2*time.Second, "waiter A after a permit was released")
	notYet(t, 2*sliceInterval, map[string]<-chan acquired{"waiter B": b, "waiter C": c})
	mustRelease(t, ctx, h2)
	gb := mustGet(t, b, 2*time.Second, "waiter B after a second permit was released")
	notYet(t, 2*sliceInterval, map[string]<-chan acquired{"waiter C": c})
	mustRelease(t, ctx, ga.h)
	gc := mustGet(t, c, 2*time.Second, "waiter C after a third permit was released")
	if !(h2.Token() < ga.h.Token() && ga.h.Token() < gb.h.Token() && gb.h.Token() < gc.h.Token()) {
		t.Errorf("tokens %d, %d, %d after %d: want strictly increasing in the order of the grants", ga.h.Token(), gb.h.Token(), gc.h.Token(), h2.Token())
	}
	mustRelease(t, ctx, gb.h)
	mustRelease(t, ctx, gc.h)
}

// A waiter that is the only participant besides a holder still fixes the
// limit: a semaphore key that someone waits for refuses another n.
func TestSemaphoreLimitOfWaiters(t *testing.T) {
	ctx := testCtx(t)
	pool := sharedPool(t, 4)
	l := newLocker(t, pool)
	k := testKey(t, "")
	h, err := l.TryAcquireSemaphore(ctx, k, 1)
	if err != nil {
		t.Fatal(err)
	}
	w := goAcquire(ctx, func(ctx context.Context) (locker.Handle, error) { return l.AcquireSemaphore(ctx, k, 1) })
	waitParticipants(t, ctx, pool, postgres.SemaphoreKey("", k), 2)
	mustRelease(t, ctx, h)
	g := mustGet(t, w, 2*time.Second, "the waiter")
	// Now the waiter holds alone; a limit of 2 is refused, at once, by
	// Acquire as by TryAcquire.
	for _, f := range []func(context.Context, string, int, ...locker.Option) (locker.Handle, error){l.TryAcquireSemaphore, l.AcquireSemaphore} {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		h2, err := f(cctx, k, 2)
		cancel()
		if err == nil {
			_ = h2.Release(ctx)
		}
		if !errors.Is(err, locker.ErrLimitMismatch) {
			t.Errorf("a limit of 2 on a semaphore of 1: %v, want ErrLimitMismatch", err)
		}
	}
	mustRelease(t, ctx, g.h)
}

// appPool is a pool whose sessions carry application_name app, so that an
// operator's statements can find them.
func appPool(t testing.TB, dsn, app string, maxConns int32) *pgxpool.Pool {
	return newPool(t, withHost(t, dsn, "", url.Values{"application_name": {app}}), maxConns)
}

// terminate ends the sessions of application app, as an operator's
// pg_terminate_backend would.
func terminate(t testing.TB, ctx context.Context, admin *pgxpool.Pool, app string) {
	t.Helper()
	var n int
	if err := admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
		t.Fatalf("pg_terminate_backend: %v", err)
	}
	if n == 0 {
		t.Fatalf("no session of %s to terminate", app)
	}
}

// A holder whose session the server ends (pg_terminate_backend, as in
// conformance's Steal) hears of the loss, and the next in the queue gets
// the key: at once for a reader-writer lock (it waits on the lock of the
// one before it, which the session's end frees), within a slice for a
// semaphore (a permit freed by the server, not by a release, sends no
// notification: the first waiter finds it when its slice ends).
func TestFamilyHolderTerminated(t *testing.T) {
	for _, sem := range []bool{true, false} {
		name := "RW"
		if sem {
			name = "Semaphore"
		}
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			srv := testserver.Postgres(t)
			admin := sharedPool(t, 4)
			app := "holder-" + name
			holder := newLocker(t, appPool(t, srv.DSN(), app, 2))
			other := newLocker(t, admin)
			k := testKey(t, "")
			var h locker.Handle
			var err error
			var next <-chan acquired
			if sem {
				h, err = holder.TryAcquireSemaphore(ctx, k, 1)
				next = goAcquire(ctx, func(ctx context.Context) (locker.Handle, error) { return other.AcquireSemaphore(ctx, k, 1) })
				waitParticipants(t, ctx, admin, postgres.SemaphoreKey("", k), 2)
			} else {
				h, err = holder.TryAcquireWrite(ctx, k)
				next = goAcquire(ctx, func(ctx context.Context) (locker.Handle, error) { return other.AcquireRead(ctx, k) })
				waitParticipants(t, ctx, admin, postgres.ReadWriteKey("", k), 2)
			}
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			terminate(t, ctx, admin, app)
			lost := waitDone(t, h, 2*testInterval, "the terminated holder")
			if !errors.Is(h.Err(), locker.ErrLost) {
				t.Errorf("the terminated holder's Err: %v, want ErrLost", h.Err())
			}
			bound := time.Second
			if sem {
				bound = testInterval + time.Second
			}
			g := mustGet(t, next, bound, "the next in the queue after the holder's session ended")
			t.Logf("the holder heard of the loss %v after the terminate; the next got the key %v after it", lost, g.at.Sub(start))
			if g.h.Token() <= h.Token() {
				t.Errorf("the next holder's token %d is not above the terminated one's %d", g.h.Token(), h.Token())
			}
			if err := h.Release(ctx); !errors.Is(err, locker.ErrLost) {
				t.Errorf("Release of the terminated holder: %v, want ErrLost", err)
			}
			mustRelease(t, ctx, g.h)
		})
	}
}

// A waiter whose session the server ends fails (not ErrNotAcquired), and
// leaves its place: those behind it move up. A writer's end lets the
// readers queued behind it in at once.
func TestFamilyWaiterTerminated(t *testing.T) {
	for _, sem := range []bool{true, false} {
		name := "RW"
		if sem {
			name = "Semaphore"
		}
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			srv := testserver.Postgres(t)
			admin := sharedPool(t, 6)
			app := "waiter-" + name
			doomed := newLocker(t, appPool(t, srv.DSN(), app, 2))
			l := newLocker(t, admin)
			k := testKey(t, "")
			var h locker.Handle
			var err error
			var first, behind <-chan acquired
			if sem {
				m := postgres.SemaphoreKey("", k)
				h, err = l.TryAcquireSemaphore(ctx, k, 1)
				first = goAcquire(ctx, func(ctx context.Context) (locker.Handle, error) { return doomed.AcquireSemaphore(ctx, k, 1) })
				waitParticipants(t, ctx, admin, m, 2)
				behind = goAcquire(ctx, func(ctx context.Context) (locker.Handle, error) { return l.AcquireSemaphore(ctx, k, 1) })
				waitParticipants(t, ctx, admin, m, 3)
			} else {
				m := postgres.ReadWriteKey("", k)
				h, err = l.TryAcquireRead(ctx, k)
				first = goAcquire(ctx, func(ctx context.Context) (locker.Handle, error) { return doomed.AcquireWrite(ctx, k) })
				waitParticipants(t, ctx, admin, m, 2)
				behind = goAcquire(ctx, func(ctx context.Context) (locker.Handle, error) { return l.AcquireRead(ctx, k) })
				waitParticipants(t, ctx, admin, m, 3)
			}
			if err != nil {
				t.Fatal(err)
			}
			terminate(t, ctx, admin, app)
			select {
			case r := <-first:
				if r.err == nil {
					_ = r.h.Release(ctx)
					t.Fatal("the terminated waiter was granted the key")
				}
				if errors.Is(r.err, locker.ErrNotAcquired) {
					t.Errorf("the terminated waiter: %v, want an error of its own, not ErrNotAcquired", r.err)
				}
				t.Logf("the terminated waiter: %v", r.err)
			case <-time.After(2 * time.Second):
				t.Fatal("the terminated waiter's Acquire had not returned 2s after its session ended")
			}
			if sem {
				notYet(t, 2*testInterval, map[string]<-chan acquired{"the waiter behind (the permit is held)": behind})
				mustRelease(t, ctx, h)
				g := mustGet(t, behind, time.Second, "the waiter behind, once the permit was released")
				mustRelease(t, ctx, g.h)
			} else {
				// Only the writer held the reader back.
				g := mustGet(t, behind, time.Second, "the reader behind the terminated writer")
				mustRelease(t, ctx, g.h)
				mustRelease(t, ctx, h)
			}
		})
	}
}

// A waiter cut off from the server, its close lost too (Proxy.Silence),
// gives up within about two slices with an error of its own, and the server
// ends its silent session by the lease its registration set
// (idle_session_timeout = the TTL): the waiter behind it then moves up, and
// gets the permit that the holder released meanwhile.
func TestFamilySilentWaiter(t *testing.T) {
	requirePG(t, 140000, "idle_session_timeout")
	ctx := testCtx(t)
	srv := testserver.Postgres(t)
	admin := sharedPool(t, 6)
	px := testserver.NewProxy(t, srv.Addr())
	cut := newLocker(t, newPool(t, withHost(t, srv.DSN(), px.Addr(), nil), 2))
	l := newLocker(t, admin)
	k := testKey(t, "")
	m := postgres.SemaphoreKey("", k)
	const ttl = 2 * time.Second

	h, err := l.TryAcquireSemaphore(ctx, k, 1)
	if err != nil {
		t.Fatal(err)
	}
	first := goAcquire(ctx, func(ctx context.Context) (locker.Handle, error) {
		return cut.AcquireSemaphore(ctx, k, 1, locker.WithTTL(ttl))
	})
	waitParticipants(t, ctx, admin, m, 2)
	behind := goAcquire(ctx, func(ctx context.Context) (locker.Handle, error) { return l.AcquireSemaphore(ctx, k, 1) })
	waitParticipants(t, ctx, admin, m, 3)

	px.Silence(t)
	silenced := time.Now()
	defer px.Heal(t)
	mustRelease(t, ctx, h)
	select {
	case r := <-first:
		if r.err == nil {
			_ = r.h.Release(ctx)
			t.Fatal("the silenced waiter was granted the permit")
		}
		if errors.Is(r.err, locker.ErrNotAcquired) {
			t.Errorf("the silenced waiter: %v, want an error of its own, not ErrNotAcquired", r.err)
		}
		t.Logf("the silenced waiter gave up %v after the silence: %v", r.at.Sub(silenced), r.err)
	case <-time.After(3*testInterval + 2*time.Second):
		t.Fatal("the silenced waiter had not given up 3 slices after the silence")
	}
	g := mustGet(t, behind, ttl+testInterval+2*time.Second, "the waiter behind the silenced one")
	t.Logf("the waiter behind got the permit %v after the silence (lease %v)", g.at.Sub(silenced), ttl)
	mustRelease(t, ctx, g.h)
}

// A cancelled wait leaves nothing on the connection it gives back to the
// pool: no advisory lock, no LISTEN, the session's own idle_session_timeout
// — whether it was cancelled while waiting on the server's lock manager (a
// writer behind a reader) or between notifications (a semaphore's first
// waiter).
func TestFamilyCancelLeavesConnectionClean(t *testing.T) {
	for _, sem := range []bool{true, false} {
		name := "RW"
		if sem {
			name = "Semaphore"
		}
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			srv := testserver.Postgres(t)
			one := newPool(t, srv.DSN(), 1)
			waiter := newLocker(t, one, postgres.WithHealthCheckInterval(sliceInterval))
			l := newLocker(t, sharedPool(t, 2))
			k := testKey(t, "")
			var h locker.Handle
			var err error
			try := func() error { _, err := waiter.TryAcquireWrite(ctx, k); return err }
			if sem {
				h, err = l.TryAcquireSemaphore(ctx, k, 1)
				try = func() error { _, err := waiter.TryAcquireSemaphore(ctx, k, 1); return err }
			} else {
				h, err = l.TryAcquireRead(ctx, k)
			}
			if err != nil {
				t.Fatal(err)
			}
			for round := range 3 {
				// A deadline within a slice, at a slice's end, and after it.
				wait := time.Duration(round+1) * sliceInterval / 2
				cctx, cancel := context.WithTimeout(ctx, wait)
				var got locker.Handle
				if sem {
					got, err = waiter.AcquireSemaphore(cctx, k, 1)
				} else {
					got, err = waiter.AcquireWrite(cctx, k)
				}
				cancel()
				if !errors.Is(err, context.DeadlineExceeded) {
					if got != nil {
						_ = got.Release(ctx)
					}
					t.Fatalf("Acquire with a deadline of %v while the key is held: %v, want DeadlineExceeded", wait, err)
				}
				if err := try(); !errors.Is(err, locker.ErrNotAcquired) {
					t.Fatalf("TryAcquire after the cancelled wait: %v, want ErrNotAcquired (a place left in the queue?)", err)
				}
			}
			mustRelease(t, ctx, h)
			c, err := one.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Release()
			var locks, channels int
			var idle string
			if err := c.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
				(SELECT count(*) FROM pg_listening_channels()), current_setting('idle_session_timeout')`).Scan(&locks, &channels, &idle); err != nil {
				t.Fatal(err)
			}
			if locks != 0 || channels != 0 || idle != "0" {
				t.Errorf("the pooled connection after cancelled waits: %d advisory locks, %d channels listened to, idle_session_timeout %s; want 0, 0, 0", locks, channels, idle)
			}
		})
	}
}

// A holder of a permit or of a write lock cut off from the server
// (Proxy.Partition) hears of the loss by its health checks, closes its
// connection, and only then can the next in the queue have the key: the
// order the contract asks for, as for the mutex.
func TestFamilyCutHolder(t *testing.T) {
	for _, sem := range []bool{true, false} {
		name := "RW"
		if sem {
			name = "Semaphore"
		}
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			srv := testserver.Postgres(t)
			admin := sharedPool(t, 4)
			hp := testserver.NewProxy(t, srv.Addr())
			cut := newLocker(t, newPool(t, withHost(t, srv.DSN(), hp.Addr(), nil), 2))
			other := newLocker(t, admin)
			k := testKey(t, "")
			var h locker.Handle
			var err error
			var next <-chan acquired
			if sem {
				h, err = cut.TryAcquireSemaphore(ctx, k, 1)
				next = goAcquire(ctx, func(ctx context.Context) (locker.Handle, error) { return other.AcquireSemaphore(ctx, k, 1) })
				waitParticipants(t, ctx, admin, postgres.SemaphoreKey("", k), 2)
			} else {
				h, err = cut.TryAcquireWrite(ctx, k)
				next = goAcquire(ctx, func(ctx context.Context) (locker.Handle, error) { return other.AcquireWrite(ctx, k) })
				waitParticipants(t, ctx, admin, postgres.ReadWriteKey("", k), 2)
			}
			if err != nil {
				t.Fatal(err)
			}
			hp.Partition(t)
			defer hp.Heal(t)
			start := time.Now()
			waitDone(t, h, 2*testInterval+2*time.Second, "the cut-off holder")
			lostAt := time.Now()
			g := mustGet(t, next, 2*testInterval+2*time.Second, "the next in the queue after the cut-off holder gave up")
			t.Logf("the cut-off holder reported the loss %v after the cut; the next got the key %v after it", lostAt.Sub(start), g.at.Sub(start))
			if g.at.Before(lostAt.Add(-time.Millisecond)) {
				t.Errorf("the next holder had the key %v before the cut-off holder reported the loss", lostAt.Sub(g.at))
			}
			if !errors.Is(h.Err(), locker.ErrLost) {
				t.Errorf("the cut-off holder's Err: %v, want ErrLost", h.Err())
			}
			if g.h.Token() <= h.Token() {
				t.Errorf("the next holder's token %d is not above the cut-off one's %d", g.h.Token(), h.Token())
			}
			mustRelease(t, ctx, g.h)
		})
	}
}

// Through a session-mode pooler, declared, the families work as directly:
// a waiter (a semaphore's first waiter LISTENs through the pooler) gets the
// permit a release frees, a cancelled writer leaves nothing; undeclared, the
// Locker refuses, and through a transaction-mode pooler it refuses declared
// or not, leaving nothing of the participation on the pooler's server
// sessions.
func TestFamiliesThroughPoolers(t *testing.T) {
	ctx := testCtx(t)
	srv := testserver.Postgres(t)
	t.Run("Session", func(t *testing.T) {
		dsn := startPgBouncer(t, srv.DSN(), "session")
		undeclared := newLocker(t, newPool(t, dsn, 2))
		if _, err := undeclared.TryAcquireSemaphore(ctx, testKey(t, ""), 2); !errors.Is(err, postgres.ErrPooler) {
			t.Fatalf("TryAcquireSemaphore through an undeclared pooler: %v, want ErrPooler", err)
		}
		a := newLocker(t, newPool(t, dsn, 3), postgres.WithSessionPooler())
		b := newLocker(t, newPool(t, dsn, 3), postgres.WithSessionPooler())
		k := testKey(t, "")
		h, err := a.TryAcquireSemaphore(ctx, k, 1)
		if err != nil {
			t.Fatal(err)
		}
		w := goAcquire(ctx, func(ctx context.Context) (locker.Handle, error) { return b.AcquireSemaphore(ctx, k, 1) })
		notYet(t, 2*testInterval, map[string]<-chan acquired{"a waiter for a held permit": w})
		mustRelease(t, ctx, h)
		g := mustGet(t, w, 2*time.Second, "the waiter after the release, through the pooler")
		mustRelease(t, ctx, g.h)

		r, err := a.TryAcquireRead(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err = b.AcquireWrite(wctx, k)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("AcquireWrite with a short deadline through the pooler: %v", err)
		}
		r2, err := b.TryAcquireRead(ctx, k)
		if err != nil {
			t.Fatalf("TryAcquireRead after the writer gave up: %v (its place left in the queue?)", err)
		}
		mustRelease(t, ctx, r2)
		mustRelease(t, ctx, r)
	})
	t.Run("Transaction", func(t *testing.T) {
		dsn := startPgBouncer(t, srv.DSN(), "transaction")
		warmServers(t, ctx, dsn, 3)
		direct := sharedPool(t, 2)
		for _, declared := range []bool{false, true} {
			var opts []postgres.Option
			if declared {
				opts = append(opts, postgres.WithSessionPooler())
			}
			l := newLocker(t, newPool(t, dsn, 4), opts...)
			k := testKey(t, "")
			for i, f := range []func() error{
				func() error { _, err := l.TryAcquireSemaphore(ctx, k, 2); return err },
				func() error { _, err := l.AcquireWrite(ctx, k); return err },
			} {
				if err := f(); !errors.Is(err, postgres.ErrPooler) {
					t.Fatalf("declared=%v call %d through a transaction-mode pooler: %v, want ErrPooler", declared, i, err)
				}
			}
			for _, m := range []int64{postgres.SemaphoreKey("", k), postgres.ReadWriteKey("", k)} {
				if n := participants(t, ctx, direct, m); n != 0 {
					t.Errorf("declared=%v: %d participants left on the pooler's server sessions", declared, n)
				}
			}
		}
	})
}

// Close ends the Locker's family waits — a semaphore's first waiter
// (between notifications), the waiter behind it (in the lock manager), a
// writer behind a reader — with ErrClosed, releases the family locks it
// holds, and leaves no participant of its own in any queue.
func TestFamilyCloseWakesWaiters(t *testing.T) {
	ctx := testCtx(t)
	admin := sharedPool(t, 4)
	other := newLocker(t, admin)
	l := postgres.New(sharedPool(t, 8), postgres.WithHealthCheckInterval(testInterval))
	defer l.Close()
	k := testKey(t, "")
	sm, rm := postgres.SemaphoreKey("", k), postgres.ReadWriteKey("", k)
	hs, err := other.TryAcquireSemaphore(ctx, k, 1)
	if err != nil {
		t.Fatal(err)
	}
	hr, err := other.TryAcquireRead(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	own, err := l.TryAcquireRead(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	first := goAcquire(ctx, func(ctx context.Context) (locker.Handle, error) { return l.AcquireSemaphore(ctx, k, 1) })
	waitParticipants(t, ctx, admin, sm, 2)
	second := goAcquire(ctx, func(ctx context.Context) (locker.Handle, error) { return l.AcquireSemaphore(ctx, k, 1) })
	waitParticipants(t, ctx, admin, sm, 3)
	writer := goAcquire(ctx, func(ctx context.Context) (locker.Handle, error) { return l.AcquireWrite(ctx, k) })
	waitParticipants(t, ctx, admin, rm, 3)

	closed := time.Now()
	if err := l.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	t.Logf("Close returned after %v", time.Since(closed))
	for what, ch := range map[string]<-chan acquired{"the first waiter": first, "the second waiter": second, "the writer": writer} {
		select {
		case r := <-ch:
			if !errors.Is(r.err, locker.ErrClosed) {
				t.Errorf("%s after Close: %v, want ErrClosed", what, r.err)
			}
		case <-time.After(2 * time.Second):
			t.Errorf("%s had not returned 2s after Close", what)
		}
	}
	if !errors.Is(own.Err(), locker.ErrReleasedByClose) {
		t.Errorf("a read lock held at Close: %v, want ErrReleasedByClose", own.Err())
	}
	// A wait that Close interrupted leaves the queue on its session, or,
	// when its step ended in the same instant as the cancel request went
	// out, closes its connection: the server ends that session when it
	// sees the close, at once for an idle session, at the end of its slice
	// for one waiting in the lock manager.
	waitParticipantsWithin(t, ctx, admin, sm, 1, 2*testInterval+time.Second)
	waitParticipantsWithin(t, ctx, admin, rm, 1, 2*testInterval+time.Second)
	mustRelease(t, ctx, hs)
	mustRelease(t, ctx, hr)
}
