package postgres_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/postgres"
)

// Two handles of one Locker on one key: the second waits for the first,
// because each has its own session (connection), and PostgreSQL would grant
// a session the same lock twice.
func TestSameLockerExcludesItself(t *testing.T) {
	ctx := testCtx(t)
	pool := sharedPool(t, 4)
	l := newLocker(t, pool)
	k := testKey(t, "")
	h1 := mustAcquire(t, ctx, l, k)
	if _, err := l.TryAcquire(ctx, k); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a key the same Locker holds: %v, want ErrNotAcquired", err)
	}
	got := make(chan locker.Handle, 1)
	go func() {
		h, err := l.Acquire(ctx, k)
		if err != nil {
			t.Errorf("second Acquire: %v", err)
		}
		got <- h
	}()
	// The second Acquire waits on the server, on a session of its own.
	waitQueued(t, ctx, pool, k, 1)
	select {
	case <-got:
		t.Fatal("second Acquire from the same Locker succeeded while the first handle held the key")
	default:
	}
	mustRelease(t, ctx, h1)
	select {
	case h2 := <-got:
		if h2.Token() <= h1.Token() {
			t.Errorf("token %d not greater than the previous holder's %d", h2.Token(), h1.Token())
		}
		mustRelease(t, ctx, h2)
	case <-time.After(5 * time.Second):
		t.Fatal("second Acquire not granted after the first handle released")
	}
}

// With every connection pinned by held locks, Acquire and TryAcquire wait
// for a connection as long as ctx allows, then say the pool is exhausted;
// a released lock frees a connection for the next.
func TestPoolExhaustion(t *testing.T) {
	ctx := testCtx(t)
	l := newLocker(t, sharedPool(t, 2))
	h1 := mustAcquire(t, ctx, l, testKey(t, "/1"))
	h2 := mustAcquire(t, ctx, l, testKey(t, "/2"))
	for _, try := range []bool{false, true} {
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		start := time.Now()
		var err error
		if try {
			_, err = l.TryAcquire(wctx, testKey(t, "/3"))
		} else {
			_, err = l.Acquire(wctx, testKey(t, "/3"))
		}
		cancel()
		if !errors.Is(err, postgres.ErrPoolExhausted) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("try=%v with the pool exhausted: %v, want ErrPoolExhausted and DeadlineExceeded", try, err)
		}
		if !strings.Contains(err.Error(), "all 2 connections") {
			t.Errorf("error does not name the pool size: %v", err)
		}
		if d := time.Since(start); d < 150*time.Millisecond || d > 3*time.Second {
			t.Errorf("returned after %v, want about the 200ms of its context", d)
		}
	}
	// A waiter gets the connection the moment a lock is released.
	got := make(chan error, 1)
	go func() {
		h, err := l.Acquire(ctx, testKey(t, "/4"))
		if err == nil {
			err = h.Release(ctx)
		}
		got <- err
	}()
	// Give it time to begin waiting: pgxpool shows no sign of a waiting
	// Acquire, and one that has not begun yet gets the connection all the same.
	time.Sleep(100 * time.Millisecond)
	mustRelease(t, ctx, h1)
	if err := <-got; err != nil {
		t.Fatalf("Acquire after a connection was freed: %v", err)
	}
	mustRelease(t, ctx, h2)
}

// Keys that hash apart are independent locks, also across namespaces; the
// same key in two namespaces is two locks.
func TestKeysHashApart(t *testing.T) {
	ctx := testCtx(t)
	pool := sharedPool(t, 10)
	a := newLocker(t, pool, postgres.WithPrefix("app-a"))
	b := newLocker(t, pool, postgres.WithPrefix("app-b"))
	base := testKey(t, "")
	keys := []string{base, base + " ", base + "/", base + "\u00e9", base + "e\u0301", strings.ToUpper(base)}
	seen := map[int64]string{}
	var held []locker.Handle
	for _, k := range keys {
		id := postgres.AdvisoryKey("app-a", k)
		if prev, dup := seen[id]; dup {
			t.Fatalf("keys %q and %q hash to the same advisory key %d", prev, k, id)
		}
		seen[id] = k
		h, err := a.TryAcquire(ctx, k)
		if err != nil {
			t.Fatalf("TryAcquire(%q) while holding %d other keys: %v", k, len(held), err)
		}
		held = append(held, h)
	}
	// Same keys, other namespace: other locks.
	hb, err := b.TryAcquire(ctx, base)
	if err != nil {
		t.Fatalf("TryAcquire of the same key in another namespace: %v", err)
	}
	mustRelease(t, ctx, hb)
	// Same namespace, another Locker: excluded.
	a2 := newLocker(t, pool, postgres.WithPrefix("app-a"))
	if _, err := a2.TryAcquire(ctx, base); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key from another Locker of the namespace: %v, want ErrNotAcquired", err)
	}
	for _, h := range held {
		mustRelease(t, ctx, h)
	}
}

// A hold much longer than the health-check interval keeps the lock: checks
// run and pass, and nobody else gets the key.
func TestLongHoldKeepsLock(t *testing.T) {
	ctx := testCtx(t)
	pool := sharedPool(t, 4)
	const interval = 250 * time.Millisecond
	l := newLocker(t, pool, postgres.WithHealthCheckInterval(interval))
	other := newLocker(t, pool)
	k := testKey(t, "")
	h := mustAcquire(t, ctx, l, k)
	deadline := time.Now().Add(12 * interval)
	for time.Now().Before(deadline) {
		select {
		case <-h.Done():
			t.Fatalf("lock lost during a healthy hold: %v", h.Err())
		case <-time.After(interval):
		}
		if _, err := other.TryAcquire(ctx, k); !errors.Is(err, locker.ErrNotAcquired) {
			t.Fatalf("another Locker's TryAcquire during the hold: %v, want ErrNotAcquired", err)
		}
	}
	mustRelease(t, ctx, h)
}

// An abandoned wait leaves no backend queued for the lock (the cancel request
// ended it) and its connection goes back to the pool.
func TestCancelledWaitLeavesNothing(t *testing.T) {
	ctx := testCtx(t)
	pool := sharedPool(t, 4)
	holder := newLocker(t, pool)
	waiter := newLocker(t, pool)
	k := testKey(t, "")
	h := mustAcquire(t, ctx, holder, k)
	opened := pool.Stat().NewConnsCount()
	for range 5 {
		// Cancel once the server shows the wait queued: a cancel that
		// reaches the server before the statement starts is lost (the
		// backend ignores it while idle), the statement then ends by its
		// slice's lock_timeout instead, and the backend rightly discards
		// such a connection (a cancel still on its way could hit the next
		// statement). A fixed short deadline raced that on a loaded machine.
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := waiter.Acquire(wctx, k)
			done <- err
		}()
		waitQueued(t, ctx, pool, k, 1)
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire cancelled while queued on a held key: %v", err)
		}
	}
	var waiting int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		AND classid = $1::bigint::oid AND objid = $2::bigint::oid`, keyHalvesOf(k)...).Scan(&waiting)
	if err != nil {
		t.Fatal(err)
	}
	if waiting != 0 {
		t.Errorf("%d backends still wait for the lock after their Acquire was cancelled", waiting)
	}
	// The waits' connections went back to the pool and were reused: a
	// cancel that raced a grant would have cost one, not five.
	if n := pool.Stat().NewConnsCount() - opened; n > 2 {
		t.Errorf("%d connections opened for 5 cancelled waits, want them reused", n)
	}
	mustRelease(t, ctx, h)
}

// Transaction-scoped locks exclude session locks on the same key, end with
// the transaction, and share the token order.
func TestLockTx(t *testing.T) {
	ctx := testCtx(t)
	pool := sharedPool(t, 6)
	l := newLocker(t, pool)
	k := testKey(t, "")
	h := mustAcquire(t, ctx, l, k)

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := l.TryLockTx(ctx, tx, k); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryLockTx of a key held by a session lock: %v, want ErrNotAcquired", err)
	}
	got := make(chan int64, 1)
	go func() {
		tok, err := l.LockTx(ctx, tx, k)
		if err != nil {
			t.Errorf("LockTx: %v", err)
		}
		got <- tok
	}()
	waitQueued(t, ctx, pool, k, 1) // LockTx waits on the server
	select {
	case <-got:
		t.Fatal("LockTx granted while a session lock held the key")
	default:
	}
	mustRelease(t, ctx, h)
	tok := <-got
	if tok <= h.Token() {
		t.Errorf("LockTx token %d not greater than the session holder's %d", tok, h.Token())
	}
	if _, err := l.TryAcquire(ctx, k); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire during the transaction lock: %v, want ErrNotAcquired", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	h2, err := l.TryAcquire(ctx, k)
	if err != nil {
		t.Fatalf("TryAcquire after the transaction committed: %v", err)
	}
	if h2.Token() <= tok {
		t.Errorf("token %d not greater than the transaction's %d", h2.Token(), tok)
	}

	// A cancelled LockTx wait leaves the transaction to be rolled back.
	tx2, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = l.LockTx(wctx, tx2, k)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LockTx with a short deadline on a held key: %v", err)
	}
	if err := tx2.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		t.Logf("rollback after cancelled LockTx: %v", err)
	}
	mustRelease(t, ctx, h2)
}

// A transaction-scoped lock belongs to the (sub)transaction that is current
// when it is taken, as the LockTx documentation warns: taken inside a
// savepoint (pgx's nested Tx), ROLLBACK TO SAVEPOINT releases it while the
// outer transaction goes on; RELEASE SAVEPOINT hands it to the outer
// transaction, which keeps it until it ends.
func TestLockTxSavepoint(t *testing.T) {
	ctx := testCtx(t)
	pool := sharedPool(t, 4)
	l, other := newLocker(t, pool), newLocker(t, pool)
	k := testKey(t, "")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)

	sp, err := tx.Begin(ctx) // SAVEPOINT
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.LockTx(ctx, sp, k); err != nil {
		t.Fatalf("LockTx in a savepoint: %v", err)
	}
	if _, err := other.TryAcquire(ctx, k); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire while a savepoint holds the key: %v, want ErrNotAcquired", err)
	}
	if err := sp.Rollback(ctx); err != nil { // ROLLBACK TO SAVEPOINT
		t.Fatal(err)
	}
	h, err := other.TryAcquire(ctx, k)
	if err != nil {
		t.Fatalf("TryAcquire after ROLLBACK TO SAVEPOINT, the outer transaction still open: %v; the documentation says the lock is gone", err)
	}
	mustRelease(t, ctx, h)

	sp, err = tx.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.LockTx(ctx, sp, k); err != nil {
		t.Fatalf("LockTx in a second savepoint: %v", err)
	}
	if err := sp.Commit(ctx); err != nil { // RELEASE SAVEPOINT
		t.Fatal(err)
	}
	if _, err := other.TryAcquire(ctx, k); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire after RELEASE SAVEPOINT: %v, want ErrNotAcquired (the outer transaction holds the key)", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	mustRelease(t, ctx, mustAcquire(t, ctx, other, k))
}

// A statement_timeout or lock_timeout on the session (a role default, say)
// does not end Acquire early: the wait starts again until ctx ends.
func TestServerTimeoutsDoNotEndWait(t *testing.T) {
	ctx := testCtx(t)
	dsn := testserver.Postgres(t).DSN()
	pool := newPool(t, withHost(t, dsn, "", url.Values{"statement_timeout": {"100"}, "lock_timeout": {"70"}}), 4)
	l := newLocker(t, pool)
	other := newLocker(t, sharedPool(t, 2))
	k := testKey(t, "")
	h := mustAcquire(t, ctx, other, k)
	got := make(chan error, 1)
	go func() {
		h, err := l.Acquire(ctx, k)
		if err == nil {
			err = h.Release(ctx)
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("Acquire returned while the key was held: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	mustRelease(t, ctx, h)
	if err := <-got; err != nil {
		t.Fatalf("Acquire after the holder released: %v", err)
	}
}

// Close of a Locker built with New releases its locks (their connections go
// back to the pool) and leaves the caller's pool open.
func TestCloseLeavesCallersPool(t *testing.T) {
	ctx := testCtx(t)
	pool := sharedPool(t, 4)
	l := postgres.New(pool, postgres.WithHealthCheckInterval(testInterval))
	h := mustAcquire(t, ctx, l, testKey(t, ""))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(h.Err(), locker.ErrReleased) || !errors.Is(h.Err(), locker.ErrClosed) {
		t.Errorf("handle after Close: Err() = %v, want ErrReleased and ErrClosed", h.Err())
	}
	if st := pool.Stat(); st.AcquiredConns() != 0 || st.IdleConns() == 0 {
		t.Errorf("after Close: %d connections acquired, %d idle; want the lock's connection back in the pool", st.AcquiredConns(), st.IdleConns())
	}
	if err := pool.Ping(ctx); err != nil {
		t.Errorf("the caller's pool after Close: %v", err)
	}
}
