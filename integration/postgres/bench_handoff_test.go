package postgres_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/internal/benchstats"
	"github.com/go-locker/locker/postgres"
)

// BenchmarkHandoffInterleaved measures one handoff to one waiter, raw
// pg_advisory_lock and the Locker in turn in every iteration, which goes
// first alternating (so load from
// other processes weighs on both alike): the holder releases while the
// other side is queued on the server (seen in pg_locks as an ungranted
// advisory lock), and the handoff is the time from the start of the
// release to the waiter's acquire returning. It reports the p50 and p99 of
// each side and the ratio of the p50s.
//
//	cd integration && go test -run '^$' -bench HandoffInterleaved -benchtime 300x ./postgres
func BenchmarkHandoffInterleaved(b *testing.B) {
	dsn := testserver.Postgres(b).DSN()
	ctx := context.Background()
	holderConn, waiterConn, watch := benchConn(b, dsn), benchConn(b, dsn), benchConn(b, dsn)
	holder, waiter := benchLocker(b, dsn, 4), benchLocker(b, dsn, 4)
	id := postgres.AdvisoryKey("bench", fmt.Sprintf("%s/%d", b.Name(), time.Now().UnixNano()))
	key := fmt.Sprintf("%s/%d", b.Name(), time.Now().UnixNano())

	// queued waits until some session waits for an advisory lock.
	queued := func() {
		for {
			var n int
			if err := watch.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").Scan(&n); err != nil {
				b.Fatalf("pg_locks: %v", err)
			}
			if n > 0 {
				return
			}
		}
	}
	exec := func(c *pgx.Conn, sql string) {
		if _, err := c.Exec(ctx, sql, id); err != nil {
			b.Errorf("%s: %v", sql, err)
		}
	}
	raw := make([]time.Duration, 0, b.N)
	lk := make([]time.Duration, 0, b.N)
	got := make(chan time.Time, 1)
	rawSide := func() {
		exec(holderConn, "SELECT pg_advisory_lock($1)")
		go func() {
			exec(waiterConn, "SELECT pg_advisory_lock($1)")
			got <- time.Now()
		}()
		queued()
		t0 := time.Now()
		exec(holderConn, "SELECT pg_advisory_unlock($1)")
		raw = append(raw, (<-got).Sub(t0))
		exec(waiterConn, "SELECT pg_advisory_unlock($1)")
	}
	lockerSide := func() {
		h, err := holder.Acquire(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan func(), 1)
		go func() {
			wh, err := waiter.Acquire(ctx, key)
			got <- time.Now()
			if err != nil {
				b.Errorf("waiting Acquire: %v", err)
				done <- func() {}
				return
			}
			done <- func() { _ = wh.Release(ctx) }
		}()
		queued()
		t0 := time.Now()
		if err := h.Release(ctx); err != nil {
			b.Fatal(err)
		}
		lk = append(lk, (<-got).Sub(t0))
		(<-done)()
	}
	// Which side goes first alternates: the first of an iteration runs on
	// a machine that was doing something else.
	for i := 0; b.Loop(); i++ {
		benchstats.Rotated(i, rawSide, lockerSide)
	}
	slices.Sort(raw)
	slices.Sort(lk)
	b.ReportMetric(benchstats.Micros(benchstats.Percentile(raw, 0.5)), "raw-p50-µs")
	b.ReportMetric(benchstats.Micros(benchstats.Percentile(raw, 0.99)), "raw-p99-µs")
	b.ReportMetric(benchstats.Micros(benchstats.Percentile(lk, 0.5)), "locker-p50-µs")
	b.ReportMetric(benchstats.Micros(benchstats.Percentile(lk, 0.99)), "locker-p99-µs")
	b.ReportMetric(float64(benchstats.Percentile(lk, 0.5))/float64(benchstats.Percentile(raw, 0.5)), "p50-ratio")
}
