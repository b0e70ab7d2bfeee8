package postgres_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/postgres"
)

// BenchmarkScale is the shared Scale case (conformance/benchmark.RunScale)
// on the Locker (a Locker per client, like separate processes, on a pool
// of two connections) beside raw pgx doing the bare advisory-lock
// statements (pg_advisory_lock, pg_advisory_unlock) on a connection per
// client, and the fenced floor (raw-fenced: the token drawn from a
// sequence in the statement that is granted the lock, as the Locker
// does), on the one test server, phase by phase. Two shapes: 8 clients
// on one key (a contended acquisition) and 40 clients on 1,000 keys (a
// random key each time; 40, not 64, to stay under the server's 200
// connections with every side open), each holder keeping its lock 1ms.
// srv-cpu-µs/acq is the server container's CPU (the engine's stats: the
// postmaster and every backend) over each side's phases divided by the
// acquisitions made in them.
//
//	cd integration && go test -run '^$' -bench '^BenchmarkScale$' -benchtime 2000x ./postgres
func BenchmarkScale(b *testing.B) {
	srv := testserver.Postgres(b)
	dsn := srv.DSN()
	seq := benchConn(b, dsn)
	if _, err := seq.Exec(context.Background(), "CREATE SEQUENCE IF NOT EXISTS bench_fence_seq AS bigint MINVALUE 1 NO CYCLE CACHE 1"); err != nil {
		b.Fatalf("CREATE SEQUENCE: %v", err)
	}
	for _, shape := range []struct{ keys, clients int }{{1, 8}, {1000, 40}} {
		b.Run(fmt.Sprintf("keys=%d,clients=%d", shape.keys, shape.clients), func(b *testing.B) {
			benchmark.RunScale(b, benchmark.Scale{
				Keys: shape.keys, Clients: shape.clients, Usage: testserver.ScaleUsage(srv),
				Sides: []benchmark.ScaleSide{
					{Name: "locker", Client: benchmark.LockerClient(func(tb testing.TB) locker.Locker { return benchLocker(tb, dsn, 2) })},
					{Name: "raw", Client: func(tb testing.TB, _ int) benchmark.Client {
						c := benchConn(tb, dsn)
						return func(key string) benchmark.Lock {
							return rawLock(c, postgres.AdvisoryKey("bench", key), false)
						}
					}},
					{Name: "raw-fenced", Client: func(tb testing.TB, _ int) benchmark.Client {
						c := benchConn(tb, dsn)
						return func(key string) benchmark.Lock {
							return rawFencedLock(c, postgres.AdvisoryKey("bench", key))
						}
					}},
				},
			})
		})
	}
}
