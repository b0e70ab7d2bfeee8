package postgres_test

import (
	"context"
	"errors"
	"maps"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
)

// A partition shorter than one health-check interval, healed, costs a held
// lock nothing, wherever it falls in the cycle of checks: a check sent
// during it is answered once it heals, within the check's deadline, and the
// server never stopped seeing the session. (Conformance's
// Loss/ShortCutKeepsLock makes one such cut, right after the grant.)
func TestShortPartitionKeepsLock(t *testing.T) {
	ctx := testCtx(t)
	srv := testserver.Postgres(t)
	hp := testserver.NewProxy(t, srv.Addr())
	l := newLocker(t, newPool(t, withHost(t, srv.DSN(), hp.Addr(), nil), 2))
	other := newLocker(t, sharedPool(t, 2))
	k := testKey(t, "")
	h := mustAcquire(t, ctx, l, k)
	// Cuts of 0.4 intervals, 0.7 intervals apart: ten of them fall on every
	// phase of the checks (each an interval of waiting, then a check).
	const cut, gap = 4 * testInterval / 10, 3 * testInterval / 10
	for i := range 10 {
		hp.Partition(t)
		time.Sleep(cut)
		hp.Heal(t)
		time.Sleep(gap)
		select {
		case <-h.Done():
			t.Fatalf("cut %d of %v, healed: the lock was lost: %v", i, cut, h.Err())
		default:
		}
		if _, err := other.TryAcquire(ctx, k); !errors.Is(err, locker.ErrNotAcquired) {
			t.Fatalf("cut %d of %v, healed: another Locker's TryAcquire: %v, want ErrNotAcquired", i, cut, err)
		}
	}
	select {
	case <-h.Done():
		t.Fatalf("after the healed cuts: the lock was lost: %v", h.Err())
	case <-time.After(2 * testInterval):
	}
	mustRelease(t, ctx, h)
}

// A waiter cut off from the server while it waits is checked as a holder
// is: the server ends each slice of the wait by itself (lock_timeout, one
// interval), so it drops a silent waiter from its queue; and a waiter that
// hears nothing for two intervals gives up and closes its connection, so
// that a lock the server granted it meanwhile, unseen, goes to the next
// client. Its Acquire fails with an error of its own (not ErrNotAcquired).
func TestCutWaiter(t *testing.T) {
	for _, releaseAtOnce := range []bool{false, true} {
		name := "ReleasedAfterCut"
		if releaseAtOnce {
			name = "ReleasedAtOnce" // the server grants the cut-off waiter the lock
		}
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			srv := testserver.Postgres(t)
			hp := testserver.NewProxy(t, srv.Addr())
			admin := sharedPool(t, 4)
			holder, other := newLocker(t, admin), newLocker(t, admin)
			waiter := newLocker(t, newPool(t, withHost(t, srv.DSN(), hp.Addr(), nil), 2))
			k := testKey(t, "")
			h := mustAcquire(t, ctx, holder, k)
			got := make(chan error, 1)
			go func() {
				hw, err := waiter.Acquire(ctx, k)
				if err == nil {
					_ = hw.Release(ctx)
					err = errors.New("granted")
				}
				got <- err
			}()
			waitQueued(t, ctx, admin, k, 1)
			hp.Partition(t)
			cut := time.Now()
			defer hp.Heal(t)
			if releaseAtOnce {
				mustRelease(t, ctx, h)
			} else {
				// The server itself drops the silent waiter within a slice.
				waitNotQueued(t, ctx, admin, k, testInterval+time.Second)
				t.Logf("the server dropped the cut-off waiter from its queue %v after the cut", time.Since(cut))
				mustRelease(t, ctx, h)
			}
			// Another client gets the key within two intervals of the cut.
			actx, cancel := context.WithTimeout(ctx, 2*testInterval+2*time.Second)
			h2, err := other.Acquire(actx, k)
			cancel()
			if err != nil {
				t.Fatalf("Acquire by another client after the cut-off waiter's holder released: %v (stranded by the cut-off waiter?)", err)
			}
			t.Logf("another client held the key %v after the cut", time.Since(cut))
			select {
			case err := <-got:
				t.Logf("the cut-off waiter's Acquire, %v after the cut: %v", time.Since(cut), err)
				if errors.Is(err, locker.ErrNotAcquired) || err.Error() == "granted" {
					t.Errorf("the cut-off waiter's Acquire: %v, want an error saying the server stopped answering", err)
				}
			case <-time.After(2*testInterval + 2*time.Second):
				t.Errorf("the cut-off waiter's Acquire had not returned %v after the cut", time.Since(cut))
			}
			hp.Heal(t)
			if _, err := waiter.TryAcquire(ctx, k); !errors.Is(err, locker.ErrNotAcquired) {
				t.Errorf("the healed waiter's TryAcquire while another client holds the key: %v, want ErrNotAcquired", err)
			}
			mustRelease(t, ctx, h2)
		})
	}
}

// waitNotQueued waits until no server backend is queued for the lock on
// key k (empty namespace), failing the test if that takes longer than
// within.
func waitNotQueued(t testing.TB, ctx context.Context, pool *pgxpool.Pool, k string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var queued int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1`, keyHalvesOf(k)...).Scan(&queued); err != nil {
			t.Fatalf("pg_locks: %v", err)
		}
		if queued == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends still queued for %q after %v", queued, k, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Close interrupts a call whose request is in flight on a dead link, and
// returns within a second, even for a Locker that opened its pool (whose
// Close waits for pgx to close the connections: pgx sends a cancel request
// for an interrupted statement and waits for the server to hang up, up to
// 15s each on a dead link). The call ends with ErrClosed.
func TestCloseInterruptsCallInFlight(t *testing.T) {
	for _, c := range []struct{ name, query string }{
		// The lock statement is in flight: the sequence was checked by a
		// first lock, and its connection is idle in the pool.
		{"LockWait", ""},
		// The sequence check is in flight, on the connection that
		// pool_min_conns made.
		{"SequenceCheck", "pool_min_conns=1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t)
			srv := testserver.Postgres(t)
			hp := testserver.NewProxy(t, srv.Addr())
			extra := url.Values{"lock_health_interval": {testInterval.String()}}
			if c.query != "" {
				q, _ := url.ParseQuery(c.query)
				maps.Copy(extra, q)
			}
			l, err := locker.Open(ctx, withHost(t, srv.DSN(), hp.Addr(), extra))
			if err != nil {
				t.Fatalf("locker.Open: %v", err)
			}
			defer l.Close()
			if c.query == "" {
				mustRelease(t, ctx, mustAcquire(t, ctx, l, testKey(t, "/first")))
			} else {
				time.Sleep(300 * time.Millisecond) // pool_min_conns connects in the background
			}
			hp.Partition(t)
			defer hp.Heal(t)
			got := make(chan error, 1)
			go func() {
				h, err := l.Acquire(ctx, testKey(t, ""))
				if err == nil {
					_ = h.Release(ctx)
				}
				got <- err
			}()
			time.Sleep(300 * time.Millisecond) // the request is on its way, and held
			select {
			case err := <-got:
				t.Fatalf("Acquire by a cut-off Locker returned before Close: %v", err)
			default:
			}
			start := time.Now()
			if err := l.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			took := time.Since(start)
			t.Logf("Close with an Acquire in flight on a dead link took %v", took)
			if took > time.Second {
				t.Errorf("Close with an Acquire in flight on a dead link took %v, want well under a second", took)
			}
			select {
			case err := <-got:
				if !errors.Is(err, locker.ErrClosed) {
					t.Errorf("Acquire in flight when its Locker closed: %v, want ErrClosed", err)
				}
			case <-time.After(time.Second):
				t.Errorf("Acquire in flight had not returned %v after Close", time.Since(start))
			}
		})
	}
}
