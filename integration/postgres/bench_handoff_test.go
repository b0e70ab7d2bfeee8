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

// BenchmarkHandoffQueued measures one handoff to one waiter: raw
// pg_advisory_lock, raw pg_advisory_lock drawing a fencing token from a
// sequence in the same statement (raw-fenced), the Locker on pools of one
// connection, and the Locker on pools of four, in turn in every iteration,
// which goes first rotating (so load from other processes weighs on all
// alike). The holder releases while the other side is queued on the server
// (seen in pg_locks as an ungranted advisory lock), and the handoff is the
// time from the start of the release to the waiter's acquire returning. It
// reports the p50 and p99 of each side and the ratios of the p50s to raw's
// and raw-fenced's.
//
// The raw side runs on two dedicated connections, one per client; the
// Locker on pools of one connection is the like-for-like comparison, and
// on pools of four the usual set-up (a pool hands out the connection
// released last, so both keep using one backend each).
//
//	cd integration && go test -run '^$' -bench HandoffQueued -benchtime 1000x ./postgres
func BenchmarkHandoffQueued(b *testing.B) {
	dsn := testserver.Postgres(b).DSN()
	ctx := context.Background()
	holderConn, waiterConn, watch := benchConn(b, dsn), benchConn(b, dsn), benchConn(b, dsn)
	holder1, waiter1 := benchLocker(b, dsn, 1), benchLocker(b, dsn, 1)
	holder4, waiter4 := benchLocker(b, dsn, 4), benchLocker(b, dsn, 4)
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
	// The least a lock with a fencing token costs here: the token drawn in
	// the statement that is granted the lock (the function in FROM runs
	// before the target list), from a sequence defined as the Locker's,
	// without its lock_timeout slice and its backend check, and with the
	// sequence named by a literal (the Locker passes its name as a
	// parameter, cast to regclass).
	if _, err := holderConn.Exec(ctx, "CREATE SEQUENCE IF NOT EXISTS bench_fence_seq AS bigint MINVALUE 1 NO CYCLE CACHE 1"); err != nil {
		b.Fatalf("CREATE SEQUENCE: %v", err)
	}
	const fencedLock = "SELECT pg_catalog.nextval('bench_fence_seq') FROM pg_catalog.pg_advisory_lock($1) AS g(v)"
	raw := make([]time.Duration, 0, b.N)
	fenced := make([]time.Duration, 0, b.N)
	lk1 := make([]time.Duration, 0, b.N)
	lk4 := make([]time.Duration, 0, b.N)
	got := make(chan time.Time, 1)
	// rawSide hands over between the two raw connections, each taking the
	// lock with lockSQL.
	rawSide := func(lockSQL string, out *[]time.Duration) {
		exec(holderConn, lockSQL)
		go func() {
			exec(waiterConn, lockSQL)
			got <- time.Now()
		}()
		queued()
		t0 := time.Now()
		exec(holderConn, "SELECT pg_advisory_unlock($1)")
		*out = append(*out, (<-got).Sub(t0))
		exec(waiterConn, "SELECT pg_advisory_unlock($1)")
	}
	lockerSide := func(holder, waiter *postgres.Locker, lk *[]time.Duration) {
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
		*lk = append(*lk, (<-got).Sub(t0))
		(<-done)()
	}
	// Which side goes first alternates: the first of an iteration runs on
	// a machine that was doing something else.
	for i := 0; b.Loop(); i++ {
		benchstats.Rotated(i,
			func() { rawSide("SELECT pg_advisory_lock($1)", &raw) },
			func() { rawSide(fencedLock, &fenced) },
			func() { lockerSide(holder1, waiter1, &lk1) },
			func() { lockerSide(holder4, waiter4, &lk4) })
	}
	for _, side := range []struct {
		name string
		d    []time.Duration
	}{{"raw", raw}, {"raw-fenced", fenced}, {"locker-pool1", lk1}, {"locker-pool4", lk4}} {
		slices.Sort(side.d)
		b.ReportMetric(benchstats.Micros(benchstats.Percentile(side.d, 0.5)), side.name+"-p50-µs")
		b.ReportMetric(benchstats.Micros(benchstats.Percentile(side.d, 0.99)), side.name+"-p99-µs")
	}
	rawP50 := float64(benchstats.Percentile(raw, 0.5))
	b.ReportMetric(float64(benchstats.Percentile(lk1, 0.5))/rawP50, "pool1/raw")
	b.ReportMetric(float64(benchstats.Percentile(lk4, 0.5))/rawP50, "pool4/raw")
	fencedP50 := float64(benchstats.Percentile(fenced, 0.5))
	b.ReportMetric(fencedP50/rawP50, "raw-fenced/raw")
	b.ReportMetric(float64(benchstats.Percentile(lk1, 0.5))/fencedP50, "pool1/raw-fenced")
	b.ReportMetric(float64(benchstats.Percentile(lk4, 0.5))/fencedP50, "pool4/raw-fenced")
}
