package sqltable_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/benchstats"
	"github.com/go-locker/locker/sqltable"
)

// The benchmarks run the Locker and, in the same loop, the statements a
// careful user would write by hand (the seed's upsert that takes an expired
// lock, and a delete guarded by the owner; no token, no renewal, no
// waiting), on the same *sql.DB:
//
//	cd integration && go test -run '^$' -bench . -benchmem -count 5 ./sqltable

func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// raw is the hand-written lock on a table of its own, its two statements
// prepared once, as the Locker's are.
type raw struct {
	db           *sql.DB
	lock, unlock string
	lockS        *sql.Stmt
	unlockS      *sql.Stmt
	mysql        bool
}

func newRaw(b testing.TB, d dialect, db *sql.DB) *raw {
	b.Helper()
	r := &raw{db: db, mysql: d.name == "MariaDB"}
	var ddl string
	switch d.name {
	case "PostgreSQL":
		ddl = `CREATE TABLE IF NOT EXISTS bench_raw (name text PRIMARY KEY, owner text NOT NULL, expires timestamptz NOT NULL)`
		r.lock = `INSERT INTO bench_raw (name, owner, expires) VALUES ($1, $2, now() + interval '30 seconds')
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires = excluded.expires
WHERE bench_raw.expires < now() RETURNING owner`
		r.unlock = `DELETE FROM bench_raw WHERE name = $1 AND owner = $2`
	case "SQLite":
		ddl = `CREATE TABLE IF NOT EXISTS bench_raw (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires REAL NOT NULL)`
		r.lock = `INSERT INTO bench_raw (name, owner, expires) VALUES (?1, ?2, unixepoch('subsec') + 30)
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires = excluded.expires
WHERE bench_raw.expires < unixepoch('subsec') RETURNING owner`
		r.unlock = `DELETE FROM bench_raw WHERE name = ?1 AND owner = ?2`
	case "MariaDB":
		ddl = "CREATE TABLE IF NOT EXISTS bench_raw (name VARBINARY(1024) PRIMARY KEY, owner VARBINARY(64) NOT NULL, expires DATETIME(6) NOT NULL)"
		r.lock = `INSERT INTO bench_raw (name, owner, expires) VALUES (?, ?, UTC_TIMESTAMP(6) + INTERVAL 30 SECOND)
ON DUPLICATE KEY UPDATE owner = IF(expires < UTC_TIMESTAMP(6), VALUES(owner), owner),
expires = IF(owner = VALUES(owner), VALUES(expires), expires)`
		r.unlock = `DELETE FROM bench_raw WHERE name = ? AND owner = ?`
	}
	if _, err := db.Exec(ddl); err != nil {
		b.Fatalf("raw DDL: %v", err)
	}
	var err error
	if r.lockS, err = db.Prepare(r.lock); err != nil {
		b.Fatal(err)
	}
	if r.unlockS, err = db.Prepare(r.unlock); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.lockS.Close(); r.unlockS.Close() })
	return r
}

func (r *raw) cycle(ctx context.Context, key string) error {
	owner := randomID()
	if r.mysql {
		res, err := r.lockS.ExecContext(ctx, key, owner)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return errors.New("raw lock not taken")
		}
	} else {
		var got string
		if err := r.lockS.QueryRowContext(ctx, key, owner).Scan(&got); err != nil {
			return err
		}
	}
	res, err := r.unlockS.ExecContext(ctx, key, owner)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errors.New("raw unlock deleted nothing")
	}
	return nil
}

// benchDB opens a pool of n connections on d, all opened before the timer.
func benchDB(b *testing.B, d dialect, n int) *sql.DB {
	b.Helper()
	db := d.admin(b)
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	var conns []*sql.Conn
	for range n {
		c, err := db.Conn(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Close()
	}
	return db
}

// BenchmarkUncontendedInterleaved alternates, one of each per iteration
// so all see the same load, a Locker's Acquire+Release and the raw
// upsert+delete on one pool (which goes first rotates): raw with
// context.Background(), as the Locker is called here, and raw with a
// cancellable context (raw-ctx). The Locker
// must stay interruptible by its Close, so its statements always carry a
// cancellable context; the drivers watch such a context on a goroutine per
// statement (go-sql-driver/mysql hands it to a watcher and back,
// modernc.org/sqlite starts one, pgx arms a watcher), which raw with
// Background skips and raw-ctx pays as well. The medians of each side are
// reported, and the ratios.
func BenchmarkUncontendedInterleaved(b *testing.B) {
	for _, d := range dialects {
		b.Run(d.name, func(b *testing.B) {
			ctx := context.Background()
			db := benchDB(b, d, 4)
			l := sqltable.New(db)
			b.Cleanup(func() { l.Close() })
			r := newRaw(b, d, db)
			key, rawKey := "bench/uncontended/"+randomID(), "bench/uncontended-raw/"+randomID()
			// Create the tables and warm the statements outside the timer.
			for range 3 {
				h, err := l.Acquire(ctx, key)
				if err != nil {
					b.Fatal(err)
				}
				if err := h.Release(ctx); err != nil {
					b.Fatal(err)
				}
				if err := r.cycle(ctx, rawKey); err != nil {
					b.Fatal(err)
				}
			}
			lockerT := make([]time.Duration, 0, b.N)
			rawT := make([]time.Duration, 0, b.N)
			rawCtxT := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			sides := []func(){
				func() {
					start := time.Now()
					h, err := l.Acquire(ctx, key)
					if err != nil {
						b.Fatal(err)
					}
					if err := h.Release(ctx); err != nil {
						b.Fatal(err)
					}
					lockerT = append(lockerT, time.Since(start))
				},
				func() {
					start := time.Now()
					if err := r.cycle(ctx, rawKey); err != nil {
						b.Fatal(err)
					}
					rawT = append(rawT, time.Since(start))
				},
				func() {
					start := time.Now()
					cctx, cancel := context.WithCancel(ctx)
					err := r.cycle(cctx, rawKey)
					cancel()
					if err != nil {
						b.Fatal(err)
					}
					rawCtxT = append(rawCtxT, time.Since(start))
				},
			}
			for i := range b.N {
				benchstats.Rotated(i, sides...)
			}
			b.StopTimer()
			slices.Sort(lockerT)
			slices.Sort(rawT)
			slices.Sort(rawCtxT)
			lp, rp, cp := benchstats.Percentile(lockerT, 0.5), benchstats.Percentile(rawT, 0.5), benchstats.Percentile(rawCtxT, 0.5)
			b.ReportMetric(benchstats.Micros(lp), "locker-p50-µs")
			b.ReportMetric(benchstats.Micros(rp), "raw-p50-µs")
			b.ReportMetric(benchstats.Micros(cp), "raw-ctx-p50-µs")
			b.ReportMetric(float64(lp)/float64(rp), "locker/raw")
			b.ReportMetric(float64(lp)/float64(cp), "locker/raw-ctx")
		})
	}
}

// BenchmarkHandoff measures, with 1, 8 and 64 waiters, the time from a
// holder starting Release to the next waiter's Acquire returning. The
// waiters are spread over up to 8 Lockers, each on a pool of its own (like
// processes); each holder keeps the lock 1ms, and a goroutine that released
// does not compete again until another has taken the lock, so every sample
// is a real handoff. Reported: p50 and p99, throughput (acquisitions/s,
// hold included) and fairness: the fewest acquisitions of any waiter over
// the mean (1 is perfectly fair, 0 means one waiter starved).
func BenchmarkHandoff(b *testing.B) {
	for _, d := range dialects {
		for _, waiters := range []int{1, 8, 64} {
			b.Run(fmt.Sprintf("%s/waiters=%d", d.name, waiters), func(b *testing.B) {
				benchHandoff(b, d, waiters+1) // the holder and its waiters
			})
		}
	}
}

func benchHandoff(b *testing.B, d dialect, goroutines int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nl := min(goroutines, 8)
	ls := make([]*sqltable.Locker, nl)
	for i := range ls {
		ls[i] = open(b, d.url(b, "", url.Values{"lock_max_conns": {"6"}}))
	}
	key := "bench/handoff/" + randomID()
	warm, err := ls[0].Acquire(ctx, key)
	if err != nil {
		b.Fatal(err)
	}
	_ = warm.Release(ctx)

	var (
		mu       sync.Mutex
		samples  []time.Duration
		relAt    atomic.Int64 // UnixNano of the last release's start, 0 for none
		acquired atomic.Int64
		per      = make([]int64, goroutines)
		wg       sync.WaitGroup
		target   = int64(b.N)
	)
	b.ResetTimer()
	start := time.Now()
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := ls[g%nl]
			for {
				seen := acquired.Load()
				h, err := l.Acquire(ctx, key)
				if err != nil {
					return // the benchmark is over
				}
				now := time.Now()
				if at := relAt.Load(); at != 0 {
					mu.Lock()
					samples = append(samples, now.Sub(time.Unix(0, at)))
					mu.Unlock()
				}
				per[g]++
				n := acquired.Add(1)
				time.Sleep(time.Millisecond)
				relAt.Store(time.Now().UnixNano())
				if err := h.Release(context.Background()); err != nil {
					b.Error(err)
				}
				if n >= target {
					cancel()
					return
				}
				// Do not compete again before someone else has taken it.
				for goroutines > 1 && acquired.Load() <= seen+1 && ctx.Err() == nil {
					time.Sleep(50 * time.Microsecond)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	benchstats.ReportPercentiles(b, samples)
	total := acquired.Load()
	b.ReportMetric(float64(total)/elapsed.Seconds(), "acq/s")
	if goroutines > 1 && total >= int64(goroutines)*4 {
		mean := float64(total) / float64(goroutines)
		b.ReportMetric(float64(slices.Min(per))/mean, "fairness-min/mean")
	}
}

var _ locker.Handle = (*sqltable.Handle)(nil)
