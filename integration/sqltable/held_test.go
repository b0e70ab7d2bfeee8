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
// requests are the server's write transactions, each lock statement being
// one: counted by the transaction IDs assigned (txid_current, which takes
// one itself), not by pg_stat_database, whose counts a backend reports up
// to seconds late (the acquisitions' commits then land in the renewals'
// window).
func heldPostgres(tb testing.TB, n int) benchmark.Held {
	admin := openDB(tb, "pgx", testserver.Postgres(tb).DSN())
	var probes int64
	writes := func() int64 {
		var v int64
		if err := admin.QueryRowContext(context.Background(), "SELECT txid_current()").Scan(&v); err != nil {
			tb.Errorf("txid_current: %v", err)
		}
		probes++
		return v - probes // without the probes' own IDs
	}
	return benchmark.Held{N: n, Requests: writes, Open: func(tb testing.TB) locker.Locker {
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
