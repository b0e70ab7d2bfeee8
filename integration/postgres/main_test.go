// Package postgres_test runs the postgres backend against a real PostgreSQL
// (and real PgBouncer processes) from the integration testserver, through the
// package's public API only, as a third-party backend's tests would. The
// tests that need no server are unit tests in the postgres package itself.
package postgres_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/postgres"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// testInterval is the health-check interval of the tests' Lockers: short, so
// that a cut-off holder hears of it within a second or two, and long enough
// that a check never times out on a loaded test machine.
const testInterval = 500 * time.Millisecond

// Each test uses keys made unique by the test name, so they can share one
// server.
func testKey(t testing.TB, suffix string) string {
	return fmt.Sprintf("%s/%d%s", t.Name(), time.Now().UnixNano(), suffix)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// withHost returns dsn with its host:port replaced by addr and the query
// parameters in extra added.
func withHost(t testing.TB, dsn, addr string, extra url.Values) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("parse DSN: %v", err)
	}
	if addr != "" {
		u.Host = addr
	}
	q := u.Query()
	for k, vs := range extra {
		q[k] = vs
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// newPool returns a pool of at most maxConns connections to dsn, closed when
// the test ends (after the Lockers built on it, which register later).
func newPool(t testing.TB, dsn string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("pgxpool.ParseConfig: %v", err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgxpool.NewWithConfig: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func sharedPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	return newPool(t, testserver.Postgres(t).DSN(), maxConns)
}

// newLocker builds a Locker on pool, closed when the test ends.
func newLocker(t testing.TB, pool *pgxpool.Pool, opts ...postgres.Option) *postgres.Locker {
	t.Helper()
	opts = append([]postgres.Option{postgres.WithHealthCheckInterval(testInterval)}, opts...)
	l := postgres.New(pool, opts...)
	t.Cleanup(func() { l.Close() })
	return l
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

// keyHalvesOf returns the pg_locks columns (classid, objid) of the advisory
// key that k maps to in the empty namespace, as postgres.AdvisoryKey
// documents them: classid holds the high 32 bits, objid the low 32, and
// objsubid is 1.
func keyHalvesOf(k string) []any { return keyHalvesIn("", k) }

func keyHalvesIn(ns, k string) []any {
	u := uint64(postgres.AdvisoryKey(ns, k))
	return []any{int64(u >> 32), int64(u & 0xFFFFFFFF)}
}

// holderPID finds, as an operator would in pg_locks, the server backend that
// holds the session lock on key k (empty namespace).
func holderPID(t testing.TB, ctx context.Context, pool *pgxpool.Pool, k string) int32 {
	t.Helper()
	return holderPIDIn(t, ctx, pool, "", k)
}

// holderPIDIn is holderPID for a key of namespace ns.
func holderPIDIn(t testing.TB, ctx context.Context, pool *pgxpool.Pool, ns, k string) int32 {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1`, keyHalvesIn(ns, k)...)
	if err != nil {
		t.Fatalf("pg_locks: %v", err)
	}
	var pids []int32
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			t.Fatalf("pg_locks: %v", err)
		}
		pids = append(pids, pid)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("pg_locks: %v", err)
	}
	if len(pids) != 1 {
		t.Fatalf("pg_locks shows %d holders of %q (%v), want 1", len(pids), k, pids)
	}
	return pids[0]
}

// waitQueued waits until at least n server backends are queued (not yet
// granted) for the session or transaction lock on key k (empty namespace):
// the sign that an Acquire or LockTx waits on the server. It fails the test
// if that does not happen within 10s.
func waitQueued(t testing.TB, ctx context.Context, pool *pgxpool.Pool, k string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var queued int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1`, keyHalvesOf(k)...).Scan(&queued); err != nil {
			t.Fatalf("pg_locks: %v", err)
		}
		if queued >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends queued for %q after 10s, want %d (was the lock granted instead?)", queued, k, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
