package sqltable_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/integration/testserver"
)

// heldPostgres is the Held case on the lock table on PostgreSQL; its
// requests are the server's committed transactions (pg_stat_database),
// each lock statement being one.
func heldPostgres(tb testing.TB, n int) benchmark.Held {
	admin := openDB(tb, "pgx", testserver.Postgres(tb).DSN())
	commits := func() int64 {
		var v int64
		// The statistics are sent by each backend when it goes idle; a
		// snapshot is enough for a rate over seconds.
		if err := admin.QueryRowContext(context.Background(), "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").Scan(&v); err != nil {
			tb.Errorf("pg_stat_database: %v", err)
		}
		return v
	}
	return benchmark.Held{N: n, Requests: commits, Open: func(tb testing.TB) locker.Locker {
		return open(tb, pgURL(tb, "", url.Values{"lock_max_conns": {"64"}}))
	}}
}

// TestHeldGoroutines: a Locker holding 2,000 locks runs no more goroutines
// than one holding 128.
func TestHeldGoroutines(t *testing.T) { benchmark.CheckHeldGoroutines(t, heldPostgres(t, 2000)) }

// BenchmarkHeld: 10,000 locks held by one Locker on PostgreSQL (TTL 30s).
//
//	cd integration && go test -run '^$' -bench '^BenchmarkHeld$' -benchtime 1x ./sqltable
func BenchmarkHeld(b *testing.B) { benchmark.RunHeld(b, heldPostgres(b, 10000)) }
