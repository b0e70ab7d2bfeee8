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
func TestHeldGoroutines(t *testing.T) {
	h := heldPostgres(t, 2000)
	h.Requests = nil // the rate is BenchmarkHeld\'s
	r := benchmark.MeasureHeld(t, h)
	t.Logf("%d locks: %d goroutines; %d locks: %d; %.0f B/lock", r.Small, r.GoroutinesSmall, r.N, r.GoroutinesN, r.BytesPerLock)
	if d := r.GoroutinesN - r.GoroutinesSmall; d > 8 {
		t.Errorf("%d goroutines more with %d locks held than with %d: a held lock must not cost a goroutine", d, r.N, r.Small)
	}
	if r.Lost > 0 {
		t.Errorf("%d held locks ended with no fault", r.Lost)
	}
}

// BenchmarkHeld: 10,000 locks held by one Locker on PostgreSQL (TTL 30s).
//
//	cd integration && go test -run '^$' -bench '^BenchmarkHeld$' -benchtime 1x ./sqltable
func BenchmarkHeld(b *testing.B) { benchmark.RunHeld(b, heldPostgres(b, 10000)) }
