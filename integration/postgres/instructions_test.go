package postgres_test

import (
	"testing"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/postgres"
)

// BenchmarkInstructions counts the client's instructions per uncontended
// Acquire+Release (valgrind's callgrind, in child processes on the same
// server; see benchmark.RunInstructions): the Locker against the bare
// advisory-lock statements (raw) and the fenced floor (raw-fenced: nextval
// in the lock statement), each on its own connection, whatever the
// loopback's speed.
//
//	cd integration && go test -run '^$' -bench '^BenchmarkInstructions$' ./postgres
func BenchmarkInstructions(b *testing.B) {
	dsn := testserver.Postgres(b).DSN()
	createFenceSeq(b, dsn)
	benchmark.RunInstructions(b, benchmark.Instructions{
		Env: []string{testserver.EnvPostgresDSN + "=" + dsn},
		Sides: []benchmark.Side{
			benchmark.LockerSide("locker", 1, func(tb testing.TB) locker.Locker { return benchLocker(tb, dsn, 2) }),
			{Name: "raw", New: func(tb testing.TB, key string, _ int) benchmark.Lock {
				return rawLock(benchConn(tb, dsn), postgres.AdvisoryKey("bench", key), false)
			}},
			{Name: "raw-fenced", New: func(tb testing.TB, key string, _ int) benchmark.Lock {
				return rawFencedLock(benchConn(tb, dsn), postgres.AdvisoryKey("bench", key))
			}},
		},
	})
}
