package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/postgres"
)

func benchConn(b testing.TB, dsn string) *pgx.Conn {
	b.Helper()
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		b.Fatalf("pgx.Connect: %v", err)
	}
	b.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func benchLocker(b testing.TB, dsn string, maxConns int32) *postgres.Locker {
	b.Helper()
	pool := newPool(b, dsn, maxConns)
	l := newLocker(b, pool)
	// Create the sequence and fill the pool's statement caches outside the
	// measurement.
	h, err := l.Acquire(context.Background(), fmt.Sprintf("%s/warm-up/%d", b.Name(), time.Now().UnixNano()))
	if err != nil {
		b.Fatalf("warm-up Acquire: %v", err)
	}
	if err := h.Release(context.Background()); err != nil {
		b.Fatalf("warm-up Release: %v", err)
	}
	// Open every connection now, as the raw baselines do before the timer.
	conns := make([]*pgxpool.Conn, 0, maxConns)
	for range maxConns {
		c, err := pool.Acquire(context.Background())
		if err != nil {
			b.Fatalf("warm-up: %v", err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	return l
}

// BenchmarkLock runs the shared cases (conformance/benchmark) on the
// Locker beside raw pgx doing the bare advisory-lock statements
// (pg_advisory_lock, pg_advisory_unlock) on a connection per contender, in
// the same run against the same server, so that the difference is the cost
// of what the Locker adds: a pinned pool connection, the fencing token, the
// health monitor, the handle. Uncontended only, TryAcquire+Release
// (locker-try) and raw pg_try_advisory_lock+unlock (raw-try) run too. The
// contenders share up to 8 Lockers (like 8 processes), each on a pool of
// lockerConns.
//
//	cd integration && go test -run '^$' -bench '^BenchmarkLock$' -benchtime 1000x ./postgres
func BenchmarkLock(b *testing.B) {
	dsn := testserver.Postgres(b).DSN()
	createFenceSeq(b, dsn)
	open := func(tb testing.TB) locker.Locker { return benchLocker(tb, dsn, lockerConns) }
	benchmark.Run(b, benchmark.Harness{Sides: []benchmark.Side{
		benchmark.LockerSide("locker", 8, open),
		{Name: "raw", New: func(tb testing.TB, key string, _ int) benchmark.Lock {
			return rawLock(benchConn(tb, dsn), postgres.AdvisoryKey("bench", key), false)
		}},
		{Name: "raw-fenced", New: func(tb testing.TB, key string, _ int) benchmark.Lock {
			return rawFencedLock(benchConn(tb, dsn), postgres.AdvisoryKey("bench", key))
		}},
		{Name: "locker-try", Floor: true, New: func(tb testing.TB, key string, _ int) benchmark.Lock {
			l := benchLocker(tb, dsn, lockerConns)
			return func(ctx context.Context) (func(context.Context) error, error) {
				h, err := l.TryAcquire(ctx, key)
				if err != nil {
					return nil, err
				}
				return h.Release, nil
			}
		}},
		{Name: "raw-try", Floor: true, New: func(tb testing.TB, key string, _ int) benchmark.Lock {
			return rawLock(benchConn(tb, dsn), postgres.AdvisoryKey("bench", key), true)
		}},
	}})
}

// lockerConns is the pool of each Locker of BenchmarkLock: 65 contenders
// on 8 Lockers, one connection each while they wait, and one to spare.
const lockerConns = 10

// rawLock is pg_advisory_lock (or, with try, pg_try_advisory_lock, which
// must get it) and pg_advisory_unlock of id on c.
func rawLock(c *pgx.Conn, id int64, try bool) benchmark.Lock {
	return func(ctx context.Context) (func(context.Context) error, error) {
		if try {
			var ok bool
			if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", id).Scan(&ok); err != nil || !ok {
				return nil, fmt.Errorf("pg_try_advisory_lock = %v, %v", ok, err)
			}
		} else if _, err := c.Exec(ctx, "SELECT pg_advisory_lock($1)", id); err != nil {
			return nil, fmt.Errorf("pg_advisory_lock: %w", err)
		}
		return rawUnlock(c, id), nil
	}
}

// createFenceSeq creates the sequence of the fenced floor (rawFencedLock).
func createFenceSeq(b testing.TB, dsn string) {
	b.Helper()
	if _, err := benchConn(b, dsn).Exec(context.Background(), "CREATE SEQUENCE IF NOT EXISTS bench_fence_seq AS bigint MINVALUE 1 NO CYCLE CACHE 1"); err != nil {
		b.Fatalf("CREATE SEQUENCE: %v", err)
	}
}

// rawFencedLock is the fenced floor: pg_advisory_lock of id with nextval of
// bench_fence_seq (the token) in the same statement, on c.
func rawFencedLock(c *pgx.Conn, id int64) benchmark.Lock {
	return func(ctx context.Context) (func(context.Context) error, error) {
		var token int64
		if err := c.QueryRow(ctx, "SELECT pg_catalog.nextval('bench_fence_seq') FROM pg_catalog.pg_advisory_lock($1) AS g(v)", id).Scan(&token); err != nil {
			return nil, fmt.Errorf("fenced pg_advisory_lock: %w", err)
		}
		return rawUnlock(c, id), nil
	}
}

// rawUnlock is pg_advisory_unlock of id on c, which must hold it.
func rawUnlock(c *pgx.Conn, id int64) func(context.Context) error {
	return func(ctx context.Context) error {
		var ok bool
		if err := c.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", id).Scan(&ok); err != nil || !ok {
			return fmt.Errorf("pg_advisory_unlock = %v, %v", ok, err)
		}
		return nil
	}
}
