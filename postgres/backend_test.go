package postgres

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/testserver"
)

// These tests run against a real PostgreSQL from internal/testserver. Each
// uses keys made unique by the test name, so they can share one server.

func testKey(t testing.TB, suffix string) string {
	return fmt.Sprintf("%s/%d%s", t.Name(), time.Now().UnixNano(), suffix)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func sharedPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	return newPool(t, testserver.Postgres(t).DSN(), maxConns)
}

func mustAcquire(t testing.TB, ctx context.Context, l locker.Locker, key string) locker.Handle {
	t.Helper()
	h, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", key, err)
	}
	return h
}

func mustRelease(t testing.TB, ctx context.Context, h locker.Handle) {
	t.Helper()
	if err := h.Release(ctx); err != nil {
		t.Fatalf("Release(%q): %v", h.Key(), err)
	}
}

func waitDone(t testing.TB, h locker.Handle, within time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-h.Done():
		return time.Since(start)
	case <-time.After(within):
		t.Fatalf("%s: Done() not closed within %v", what, within)
		return 0
	}
}

// Two handles of one Locker on one key: the second waits for the first,
// because each has its own session (connection), and PostgreSQL would grant
// a session the same lock twice.
func TestSameLockerExcludesItself(t *testing.T) {
	ctx := testCtx(t)
	l := newLocker(t, sharedPool(t, 4))
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
	select {
	case <-got:
		t.Fatal("second Acquire from the same Locker succeeded while the first handle held the key")
	case <-time.After(300 * time.Millisecond):
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
		if !errors.Is(err, ErrPoolExhausted) || !errors.Is(err, context.DeadlineExceeded) {
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
	time.Sleep(100 * time.Millisecond)
	mustRelease(t, ctx, h1)
	if err := <-got; err != nil {
		t.Fatalf("Acquire after a connection was freed: %v", err)
	}
	mustRelease(t, ctx, h2)
}

// A server restart ends every session; the holder hears of it at once (the
// server's FATAL message wakes the health monitor), not a check later.
func TestServerRestartEndsHold(t *testing.T) {
	srv := testserver.NewPostgres(t)
	if !srv.CanControl() {
		t.Skipf("needs a server the test may restart; %s is not", srv)
	}
	ctx := testCtx(t)
	pool := newPool(t, srv.DSN(), 4)
	l := newLocker(t, pool, WithHealthCheckInterval(time.Minute))
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
	l := newLocker(t, pool, WithHealthCheckInterval(time.Minute))
	k := testKey(t, "")
	h := mustAcquire(t, ctx, l, k)
	pid := h.(*handle).pid
	var ok bool
	if err := pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", int32(pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
	}
	took := waitDone(t, h, 5*time.Second, "holder whose backend was terminated")
	t.Logf("Done() closed %v after pg_terminate_backend (check interval 1m)", took)
	if !errors.Is(h.Err(), locker.ErrLost) {
		t.Fatalf("Err() = %v, want ErrLost", h.Err())
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
	l := newLocker(t, newPool(t, withHost(t, srv.DSN(), px.Addr(), nil), 4), WithHealthCheckInterval(time.Minute))
	h := mustAcquire(t, ctx, l, testKey(t, ""))
	px.ResetAll(t)
	took := waitDone(t, h, 5*time.Second, "holder whose connection was reset")
	t.Logf("Done() closed %v after the reset", took)
	if !errors.Is(h.Err(), locker.ErrLost) {
		t.Fatalf("Err() = %v, want ErrLost", h.Err())
	}
}

// Keys that hash apart are independent locks, also across namespaces; the
// same key in two namespaces is two locks.
func TestKeysHashApart(t *testing.T) {
	ctx := testCtx(t)
	pool := sharedPool(t, 10)
	a := newLocker(t, pool, WithNamespace("app-a"))
	b := newLocker(t, pool, WithNamespace("app-b"))
	base := testKey(t, "")
	keys := []string{base, base + " ", base + "/", base + "\u00e9", base + "e\u0301", strings.ToUpper(base)}
	seen := map[int64]string{}
	var held []locker.Handle
	for _, k := range keys {
		id := AdvisoryKey("app-a", k)
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
	a2 := newLocker(t, pool, WithNamespace("app-a"))
	if _, err := a2.TryAcquire(ctx, base); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key from another Locker of the namespace: %v, want ErrNotAcquired", err)
	}
	for _, h := range held {
		mustRelease(t, ctx, h)
	}
}

// AdvisoryKey is part of the documented interface (other programs compute
// it): its values must never change.
func TestAdvisoryKeyStable(t *testing.T) {
	for _, c := range []struct {
		ns, key string
		want    int64
	}{
		{"", "a", -618856784144191045},
		{"billing", "invoice/42", 8439653440304532941},
	} {
		if got := AdvisoryKey(c.ns, c.key); got != c.want {
			t.Errorf("AdvisoryKey(%q, %q) = %d, want %d", c.ns, c.key, got, c.want)
		}
	}
	// The namespace is length-prefixed: moving bytes between namespace and
	// key gives another lock.
	if AdvisoryKey("a", "bc") == AdvisoryKey("ab", "c") {
		t.Error(`AdvisoryKey("a", "bc") == AdvisoryKey("ab", "c")`)
	}
}

// A hold much longer than the health-check interval keeps the lock: checks
// run and pass, and nobody else gets the key.
func TestLongHoldKeepsLock(t *testing.T) {
	ctx := testCtx(t)
	pool := sharedPool(t, 4)
	const interval = 250 * time.Millisecond
	l := newLocker(t, pool, WithHealthCheckInterval(interval))
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
		wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err := waiter.Acquire(wctx, k)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire with a short deadline on a held key: %v", err)
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

func keyHalvesOf(k string) []any {
	hi, lo := keyHalves(AdvisoryKey("", k))
	return []any{hi, lo}
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
	time.Sleep(200 * time.Millisecond)
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

// The sequence is checked before any lock is taken: WithoutDDL shows the SQL
// to run; a cached sequence (tokens out of order between sessions) is
// refused; a custom, schema-qualified, quoted name works.
func TestSequence(t *testing.T) {
	ctx := testCtx(t)
	pool := sharedPool(t, 4)
	suffix := fmt.Sprintf("%d", time.Now().UnixNano())

	missing := "locker_test_missing_" + suffix
	l := newLocker(t, pool, WithSequence(missing), WithoutDDL())
	_, err := l.TryAcquire(ctx, testKey(t, ""))
	if err == nil || !strings.Contains(err.Error(), "CREATE SEQUENCE IF NOT EXISTS "+missing) {
		t.Fatalf("TryAcquire with a missing sequence and WithoutDDL: %v, want the CREATE SEQUENCE to run", err)
	}

	cached := "locker_test_cached_" + suffix
	if _, err := pool.Exec(ctx, "CREATE SEQUENCE "+cached+" CACHE 20"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP SEQUENCE IF EXISTS "+cached) })
	l = newLocker(t, pool, WithSequence(cached))
	if _, err := l.TryAcquire(ctx, testKey(t, "")); err == nil || !strings.Contains(err.Error(), "CACHE 1") {
		t.Fatalf("TryAcquire with a CACHE 20 sequence: %v, want a refusal naming CACHE 1", err)
	}

	schema := "locker_test_" + suffix
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	name := schema + `."Fence ""seq"""`
	l = newLocker(t, pool, WithSequence(name))
	h, err := l.TryAcquire(ctx, testKey(t, ""))
	if err != nil {
		t.Fatalf("TryAcquire with sequence %s: %v", name, err)
	}
	if h.Token() != 1 {
		t.Errorf("first token of a new sequence = %d, want 1", h.Token())
	}
	mustRelease(t, ctx, h)

	for _, bad := range []string{"", "a;DROP TABLE x", "a.b.c", `"unterminated`, "1abc"} {
		l := New(pool, WithSequence(bad))
		if _, err := l.TryAcquire(ctx, testKey(t, "")); !errors.Is(err, locker.ErrInvalidOption) {
			t.Errorf("WithSequence(%q): %v, want ErrInvalidOption", bad, err)
		}
		l.Close()
	}
	l = New(pool, WithHealthCheckInterval(0))
	if _, err := l.Acquire(ctx, testKey(t, "")); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("WithHealthCheckInterval(0): %v, want ErrInvalidOption", err)
	}
	l.Close()
}

// Open parses our parameters strictly, passes the rest to pgx, never shows
// the password, and owns (closes) its pool.
func TestOpenURL(t *testing.T) {
	ctx := testCtx(t)
	dsn := testserver.Postgres(t).DSN()
	for _, scheme := range []string{"postgres", "postgresql"} {
		u := withHost(t, dsn, "", url.Values{"lock_namespace": {"url-test"}, "lock_health_interval": {"1s"}, "pool_max_conns": {"3"}})
		u = scheme + u[strings.Index(u, "://"):]
		l, err := locker.Open(ctx, u)
		if err != nil {
			t.Fatalf("Open(%s): %v", scheme, err)
		}
		pl := l.(*Locker)
		if pl.cfg.namespace != "url-test" || pl.cfg.interval != time.Second || pl.pool.Config().MaxConns != 3 {
			t.Errorf("Open(%s): namespace %q, interval %v, max conns %d", scheme, pl.cfg.namespace, pl.cfg.interval, pl.pool.Config().MaxConns)
		}
		h, err := l.TryAcquire(ctx, testKey(t, ""))
		if err != nil {
			t.Fatalf("TryAcquire on an opened Locker: %v", err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(h.Err(), locker.ErrReleased) {
			t.Errorf("handle after Close: Err() = %v, want ErrReleased", h.Err())
		}
		if _, err := pl.pool.Acquire(ctx); err == nil {
			t.Errorf("the pool of an opened Locker is still open after Close")
		}
	}

	for _, c := range []struct{ query, want string }{
		{"lock_namspace=x", "lock_namspace"},
		{"lock_health_interval=soon", "lock_health_interval"},
		{"lock_health_interval=-1s", "lock_health_interval"},
		{"lock_ddl=maybe", "lock_ddl"},
		{"lock_sequence=a.b.c", "sequence"},
		{"lock_namespace=a&lock_namespace=b", "lock_namespace"},
	} {
		u := "postgres://alice:s3cr3t-pw@127.0.0.1:1/db?" + c.query
		_, err := locker.Open(ctx, u)
		if !errors.Is(err, locker.ErrInvalidURL) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open(?%s): %v, want ErrInvalidURL naming %s", c.query, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cr3t-pw") {
			t.Errorf("Open(?%s): error shows the password: %v", c.query, err)
		}
	}
	// A server that refuses the password: the error says so without it.
	bad := withHost(t, dsn, "", nil)
	bu, _ := url.Parse(bad)
	bu.User = url.UserPassword(bu.User.Username(), "wr0ng-pw-xyz")
	_, err := locker.Open(ctx, bu.String())
	if err == nil {
		t.Log("server accepted a wrong password (trust authentication?); skipping the refusal check")
	} else if strings.Contains(err.Error(), "wr0ng-pw-xyz") {
		t.Errorf("Open with a wrong password: error shows it: %v", err)
	}
	// An unreachable server fails Open, password unseen.
	_, err = locker.Open(ctx, "postgres://alice:s3cr3t-pw@127.0.0.1:1/db?connect_timeout=2")
	if err == nil || strings.Contains(err.Error(), "s3cr3t-pw") {
		t.Errorf("Open of an unreachable server: %v", err)
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

// A wait cancelled while the link is dead (no cancel request can get
// through) still returns promptly, and Close still ends in bounded time.
func TestCancelOnDeadLink(t *testing.T) {
	srv := testserver.Postgres(t)
	px := testserver.NewProxy(t, srv.Addr())
	ctx := testCtx(t)
	holder := newLocker(t, sharedPool(t, 2))
	waiter := newLocker(t, newPool(t, withHost(t, srv.DSN(), px.Addr(), nil), 2))
	k := testKey(t, "")
	h := mustAcquire(t, ctx, holder, k)
	wctx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(wctx, k)
		got <- err
	}()
	time.Sleep(300 * time.Millisecond) // queued on the server
	px.Blackhole(t)
	cancelled := time.Now()
	cancel()
	err := <-got
	took := time.Since(cancelled)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire on a dead link: %v", err)
	}
	if took > abandonWait+time.Second {
		t.Errorf("cancelled Acquire on a dead link returned after %v, want about %v", took, abandonWait)
	}
	t.Logf("returned %v after its context ended", took)
	closing := time.Now()
	waiter.Close()
	d := time.Since(closing)
	t.Logf("Close took %v", d)
	if d > cancelRequestTimeout+cancelGrace+2*time.Second {
		t.Errorf("Close took %v", d)
	}
	px.Heal(t)
	mustRelease(t, ctx, h)
}

// A role that may not run DDL (the default since PostgreSQL 15, which no
// longer lets every role create in public): creating the sequence fails with
// an error that shows the SQL to run; with the sequence created by an
// administrator and WithoutDDL, locks work.
func TestRoleWithoutDDL(t *testing.T) {
	ctx := testCtx(t)
	dsn := testserver.Postgres(t).DSN()
	admin := newPool(t, dsn, 2)
	suffix := fmt.Sprintf("%d", time.Now().UnixNano())
	role, schema := "locker_app_"+suffix, "locker_s_"+suffix
	if _, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN PASSWORD 'app-pw'"); err != nil {
		t.Skipf("cannot create a role on this server: %v", err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		admin.Exec(ctx, "DROP OWNED BY "+role)
		admin.Exec(ctx, "DROP ROLE IF EXISTS "+role)
	})
	var canCreate bool
	if err := admin.QueryRow(ctx, "SELECT has_schema_privilege($1, 'public', 'CREATE')", role).Scan(&canCreate); err != nil {
		t.Fatal(err)
	}
	seq := schema + ".fence"
	for _, stmt := range []string{
		"CREATE SCHEMA " + schema,
		createSequenceSQL(seq),
		"GRANT USAGE ON SCHEMA " + schema + " TO " + role,
		"GRANT USAGE ON SEQUENCE " + seq + " TO " + role,
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	u, _ := url.Parse(dsn)
	u.User = url.UserPassword(role, "app-pw")
	app := newPool(t, u.String(), 2)

	if !canCreate {
		l := newLocker(t, app, WithSequence("locker_fence_"+suffix))
		_, err := l.TryAcquire(ctx, testKey(t, ""))
		if err == nil || !strings.Contains(err.Error(), "WithoutDDL") || !strings.Contains(err.Error(), "CREATE SEQUENCE") {
			t.Errorf("TryAcquire by a role that may not create the sequence: %v, want an error showing the SQL", err)
		}
	} else {
		t.Log("this server lets every role create in public; skipping the refusal check")
	}
	l := newLocker(t, app, WithSequence(seq), WithoutDDL())
	h, err := l.TryAcquire(ctx, testKey(t, ""))
	if err != nil {
		t.Fatalf("TryAcquire with an administrator-made sequence: %v", err)
	}
	if h.Token() != 1 {
		t.Errorf("first token = %d, want 1", h.Token())
	}
	mustRelease(t, ctx, h)
}
