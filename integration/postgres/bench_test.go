package postgres_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/internal/benchstats"
	"github.com/go-locker/locker/postgres"
)

// Every benchmark runs this package's Locker and a raw pgx baseline doing the
// bare advisory-lock statements, in the same run against the same server, so
// the difference is the cost of what the Locker adds: a pinned pool
// connection, the fencing token, the health monitor, the handle.
//
//	cd integration && go test -run '^$' -bench . -benchmem -count 5 ./postgres

func benchConn(b *testing.B, dsn string) *pgx.Conn {
	b.Helper()
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		b.Fatalf("pgx.Connect: %v", err)
	}
	b.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func benchLocker(b *testing.B, dsn string, maxConns int32) *postgres.Locker {
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

// BenchmarkUncontended: one goroutine takes and releases a key nobody else
// wants.
func BenchmarkUncontended(b *testing.B) {
	dsn := testserver.Postgres(b).DSN()
	ctx := context.Background()
	b.Run("raw-pgx/try+unlock", func(b *testing.B) {
		c := benchConn(b, dsn)
		id := postgres.AdvisoryKey("bench", b.Name())
		for b.Loop() {
			var ok bool
			if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", id).Scan(&ok); err != nil || !ok {
				b.Fatalf("pg_try_advisory_lock = %v, %v", ok, err)
			}
			if err := c.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", id).Scan(&ok); err != nil || !ok {
				b.Fatalf("pg_advisory_unlock = %v, %v", ok, err)
			}
		}
	})
	for _, try := range []bool{true, false} {
		name := "locker/Acquire+Release"
		if try {
			name = "locker/TryAcquire+Release"
		}
		b.Run(name, func(b *testing.B) {
			l := benchLocker(b, dsn, 4)
			key := fmt.Sprintf("%s/%d", b.Name(), time.Now().UnixNano())
			for b.Loop() {
				var h locker.Handle
				var err error
				if try {
					h, err = l.TryAcquire(ctx, key)
				} else {
					h, err = l.Acquire(ctx, key)
				}
				if err != nil {
					b.Fatal(err)
				}
				if err := h.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHandoff measures the latency of a handoff: from the moment the
// holder starts its release to the moment the next waiter's acquire returns,
// with 1, 8 and 64 goroutines waiting. Each holder keeps the lock for
// handoffHold so that the others are queued on the server when it lets go.
// ns/op includes that hold; read the p50 and p99 metrics.
func BenchmarkHandoff(b *testing.B) {
	dsn := testserver.Postgres(b).DSN()
	for _, waiters := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("waiters=%d/raw-pgx", waiters), func(b *testing.B) {
			id := postgres.AdvisoryKey("bench", fmt.Sprintf("%s/%d", b.Name(), time.Now().UnixNano()))
			conns := make([]*pgx.Conn, waiters+1)
			for i := range conns {
				conns[i] = benchConn(b, dsn)
			}
			runHandoff(b, waiters+1, func(ctx context.Context, g int) func() {
				if _, err := conns[g].Exec(ctx, "SELECT pg_advisory_lock($1)", id); err != nil {
					b.Errorf("pg_advisory_lock: %v", err)
					return nil
				}
				return func() {
					if _, err := conns[g].Exec(ctx, "SELECT pg_advisory_unlock($1)", id); err != nil {
						b.Errorf("pg_advisory_unlock: %v", err)
					}
				}
			})
		})
		b.Run(fmt.Sprintf("waiters=%d/locker", waiters), func(b *testing.B) {
			l := benchLocker(b, dsn, int32(waiters)+2)
			key := fmt.Sprintf("%s/%d", b.Name(), time.Now().UnixNano())
			runHandoff(b, waiters+1, func(ctx context.Context, g int) func() {
				h, err := l.Acquire(ctx, key)
				if err != nil {
					b.Errorf("Acquire: %v", err)
					return nil
				}
				return func() {
					if err := h.Release(ctx); err != nil {
						b.Errorf("Release: %v", err)
					}
				}
			})
		})
	}
}

const handoffHold = time.Millisecond

// runHandoff runs n goroutines that take turns holding one lock through
// acquire (which returns the release function) until b.N acquisitions were
// made, and reports the handoff latency percentiles.
func runHandoff(b *testing.B, n int, acquire func(ctx context.Context, g int) func()) {
	ctx := context.Background()
	var (
		remaining   atomic.Int64
		lastRelease atomic.Int64 // UnixNano when the last holder began to release
		mu          sync.Mutex
		samples     = make([]time.Duration, 0, b.N)
		wg          sync.WaitGroup
	)
	remaining.Store(int64(b.N))
	b.ResetTimer()
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				release := acquire(ctx, g)
				if release == nil {
					return
				}
				got := time.Now()
				if remaining.Add(-1) < 0 {
					release()
					return
				}
				if lr := lastRelease.Load(); lr != 0 {
					mu.Lock()
					samples = append(samples, got.Sub(time.Unix(0, lr)))
					mu.Unlock()
				}
				time.Sleep(handoffHold)
				lastRelease.Store(time.Now().UnixNano())
				release()
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	benchstats.ReportPercentiles(b, samples)
}

// BenchmarkContended: 8 goroutines take and release one key as fast as they
// can; ns/op is the time per acquisition, so 1e9/ns_op is the throughput.
func BenchmarkContended(b *testing.B) {
	const goroutines = 8
	dsn := testserver.Postgres(b).DSN()
	run := func(b *testing.B, acquire func(ctx context.Context, g int) func()) {
		ctx := context.Background()
		var remaining atomic.Int64
		remaining.Store(int64(b.N))
		var wg sync.WaitGroup
		b.ResetTimer()
		start := time.Now()
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for remaining.Add(-1) >= 0 {
					release := acquire(ctx, g)
					if release == nil {
						return
					}
					release()
				}
			}()
		}
		wg.Wait()
		b.StopTimer()
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "acq/s")
	}
	b.Run("raw-pgx", func(b *testing.B) {
		id := postgres.AdvisoryKey("bench", fmt.Sprintf("%s/%d", b.Name(), time.Now().UnixNano()))
		conns := make([]*pgx.Conn, goroutines)
		for i := range conns {
			conns[i] = benchConn(b, dsn)
		}
		run(b, func(ctx context.Context, g int) func() {
			if _, err := conns[g].Exec(ctx, "SELECT pg_advisory_lock($1)", id); err != nil {
				b.Errorf("pg_advisory_lock: %v", err)
				return nil
			}
			return func() {
				if _, err := conns[g].Exec(ctx, "SELECT pg_advisory_unlock($1)", id); err != nil {
					b.Errorf("pg_advisory_unlock: %v", err)
				}
			}
		})
	})
	b.Run("locker", func(b *testing.B) {
		l := benchLocker(b, dsn, goroutines+2)
		key := fmt.Sprintf("%s/%d", b.Name(), time.Now().UnixNano())
		run(b, func(ctx context.Context, g int) func() {
			h, err := l.Acquire(ctx, key)
			if err != nil {
				b.Errorf("Acquire: %v", err)
				return nil
			}
			return func() {
				if err := h.Release(ctx); err != nil {
					b.Errorf("Release: %v", err)
				}
			}
		})
	})
}

// BenchmarkUncontendedPaired alternates a raw pgx try+unlock and a Locker
// TryAcquire+Release (and Acquire+Release) in every iteration and reports
// the median of each, so that load from other processes, which comes and goes
// on shared machines, weighs on both sides alike.
func BenchmarkUncontendedPaired(b *testing.B) {
	dsn := testserver.Postgres(b).DSN()
	ctx := context.Background()
	c := benchConn(b, dsn)
	l := benchLocker(b, dsn, 4)
	id := postgres.AdvisoryKey("bench", b.Name())
	key := fmt.Sprintf("%s/%d", b.Name(), time.Now().UnixNano())
	raw := make([]time.Duration, 0, b.N)
	try := make([]time.Duration, 0, b.N)
	acq := make([]time.Duration, 0, b.N)
	sides := []func(){
		func() {
			t0 := time.Now()
			var ok bool
			if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", id).Scan(&ok); err != nil || !ok {
				b.Fatalf("pg_try_advisory_lock = %v, %v", ok, err)
			}
			if err := c.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", id).Scan(&ok); err != nil || !ok {
				b.Fatalf("pg_advisory_unlock = %v, %v", ok, err)
			}
			raw = append(raw, time.Since(t0))
		},
		func() {
			t0 := time.Now()
			h, err := l.TryAcquire(ctx, key)
			if err != nil {
				b.Fatal(err)
			}
			if err := h.Release(ctx); err != nil {
				b.Fatal(err)
			}
			try = append(try, time.Since(t0))
		},
		func() {
			t0 := time.Now()
			h, err := l.Acquire(ctx, key)
			if err != nil {
				b.Fatal(err)
			}
			if err := h.Release(ctx); err != nil {
				b.Fatal(err)
			}
			acq = append(acq, time.Since(t0))
		},
	}
	for i := 0; b.Loop(); i++ {
		benchstats.Rotated(i, sides...)
	}
	med := func(s []time.Duration) float64 {
		slices.Sort(s)
		return float64(s[len(s)/2]) / float64(time.Microsecond)
	}
	r, tr, ac := med(raw), med(try), med(acq)
	b.ReportMetric(r, "raw-µs")
	b.ReportMetric(tr, "try-µs")
	b.ReportMetric(ac, "acquire-µs")
	b.ReportMetric(tr/r, "try/raw")
	b.ReportMetric(ac/r, "acquire/raw")
}
