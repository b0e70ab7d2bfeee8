package sqltable_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"cirello.io/pglock"
	_ "github.com/lib/pq" // the driver pglock.New insists on
	gomysqllock "github.com/sanketplus/go-mysql-lock"

	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/internal/benchstats"
)

// The comparison benchmarks run the Locker on PostgreSQL beside
// cirello.io/pglock, the Go lock-table library a user of PostgreSQL would
// otherwise pick (and one of the anchors the backend's issue names), in the
// same process, on the same server:
//
//	cd integration && go test -run '^$' -bench 'Lock/PostgreSQL/Uncontended' -benchtime 2000x -count 3 ./sqltable
//	cd integration && go test -run '^$' -bench PglockContended -benchtime 256x ./sqltable
//
// pglock keeps its defaults (a 20s lease, a heartbeat every 5s, which it also
// sends once as soon as a lock is taken) and its own table. It hands out a
// record version number that changes with every heartbeat, so it is no
// fencing token, and it reports a lost lock only by a failed heartbeat.
// Its Acquire waits by sleeping the whole lease between tries; under
// contention here it polls instead, every pollInterval and every 10 times
// that, so that its handoff is near its best and its cost shows in the
// statements and writes its tries make. Each try is a fresh one with
// FailIfLocked: retrying with the same pglock.Lock would take over any lock
// whose version had not changed since the last try, which after 1ms is
// every live lock.

// pollInterval is how long a polling competitor sleeps between tries.
const pollInterval = time.Millisecond

// pglockTable is the table the pglock clients share.
const pglockTable = "bench_pglock"

// newPglock opens a pglock client on a pool of its own of at most conns
// connections: through lib/pq and pglock.New, the driver pglock supports,
// or, with viaPgx, through pgx's database/sql driver (the Locker's) and
// pglock.UnsafeNew, which tells the driver's cost from the library's.
func newPglock(b testing.TB, viaPgx bool, conns int, more ...pglock.ClientOption) *pglock.Client {
	b.Helper()
	dsn := testserver.Postgres(b).DSN()
	opts := append([]pglock.ClientOption{pglock.WithCustomTable(pglockTable)}, more...)
	var (
		c   *pglock.Client
		err error
		db  *sql.DB
	)
	if viaPgx {
		db = openDB(b, "pgx", dsn)
		c, err = pglock.UnsafeNew(db, opts...)
	} else {
		db = openDB(b, "postgres", dsn)
		c, err = pglock.New(db, opts...)
	}
	if err != nil {
		b.Fatalf("pglock: %v", err)
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	if err := c.TryCreateTable(); err != nil {
		b.Fatalf("pglock: %v", err)
	}
	return c
}

// pglockTake takes name with c, trying every poll until it does or ctx
// ends; tries counts the attempts.
func pglockTake(ctx context.Context, c *pglock.Client, name string, poll time.Duration, tries *atomic.Int64) (*pglock.Lock, error) {
	for {
		tries.Add(1)
		l, err := c.AcquireContext(ctx, name, pglock.FailIfLocked())
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, pglock.ErrNotAcquired) {
			return nil, err
		}
		select {
		case <-time.After(poll):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// contention is a group of competitors of one implementation on one
// dialect, n goroutines spread over up to 8 clients (a Locker, or a client
// of the other library, each on a pool of its own, like processes), that
// take and give back one key, holding it contendedHold each time, with the
// server's work.
type contention struct {
	benchstats.Contention
	b     *testing.B
	d     dialect
	impl  string
	admin *sql.DB
	tries atomic.Int64 // a polling library's attempts
	srv   int64        // see serverWork; total over the phases run so far
}

// contendedHold is how long a competitor keeps the key.
const contendedHold = time.Millisecond

// newContention makes n competitors named impl on d: client is called once
// per client with its pool size and the group's key, and returns how that
// client's goroutines take the key.
func newContention(b *testing.B, d dialect, impl string, n int, client func(conns int, key string) benchstats.Take) *contention {
	g := &contention{b: b, d: d, impl: impl, admin: d.admin(b)}
	g.Hold = contendedHold
	key := "bench/compare-contended/" + randomID()
	clients := min(n, 8)
	perClient := (n + clients - 1) / clients
	takes := make([]benchstats.Take, clients)
	for i := range takes {
		takes[i] = client(perClient+1, key)
	}
	for i := range n {
		g.Takes = append(g.Takes, takes[i%clients])
	}
	return g
}

// lockerClient is newContention's client for a Locker on d.
func lockerClient(b *testing.B, d dialect) func(int, string) benchstats.Take {
	return func(conns int, key string) benchstats.Take {
		l := open(b, d.url(b, "", url.Values{"lock_max_conns": {fmt.Sprint(conns)}}))
		return func(ctx context.Context) (func(context.Context) error, error) {
			h, err := l.Acquire(ctx, key)
			if err != nil {
				return nil, err
			}
			return h.Release, nil
		}
	}
}

// serverWork reads a counter of the server's work: on PostgreSQL the bytes
// of WAL written (every row a statement writes, a failed try's rewrite
// included), on MariaDB the statements it ran (Questions; the query itself
// counts one).
func (g *contention) serverWork() int64 {
	var n int64
	var err error
	switch g.d.name {
	case "PostgreSQL":
		err = g.admin.QueryRow(`SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint`).Scan(&n)
	case "MariaDB":
		var name string
		err = g.admin.QueryRow(`SHOW GLOBAL STATUS LIKE 'Questions'`).Scan(&name, &n)
	}
	if err != nil {
		g.b.Fatal(err)
	}
	return n
}

func (g *contention) serverMetric() string {
	if g.d.name == "MariaDB" {
		return "stmts/acq"
	}
	return "wal-B/acq"
}

// run makes n acquisitions, all goroutines competing, and adds them and
// the server's work to the totals.
func (g *contention) run(n int64) {
	srv := g.serverWork()
	if err := g.Run(context.Background(), n); err != nil {
		g.b.Error(err)
	}
	g.srv += g.serverWork() - srv
}

// warm lets every competitor take the key a few times, then forgets what
// that cost.
func (g *contention) warm() {
	g.run(int64(3 * len(g.Takes)))
	g.tries.Store(0)
	g.Reset()
	g.srv = 0
}

func (g *contention) report() {
	sfx, n := "-"+g.impl, float64(g.Acquired)
	g.Report(g.b, sfx)
	g.b.ReportMetric(float64(g.srv)/n, g.serverMetric()+sfx)
	if t := g.tries.Load(); t > 0 {
		g.b.ReportMetric(float64(t)/n, "tries/acq"+sfx)
	}
}

// compareContended runs, for 8 and for 64 competitors, the groups that
// groups makes (the Locker's first), each on a key of its own, in phases of
// phase acquisitions, rotating which group runs so that all see the same
// machine load. b.N acquisitions per group, rounded up to whole phases.
// Reported for each group (suffixed with its name): acquisitions per second
// (hold included), the server's work per acquisition (serverWork), a
// polling library's tries per acquisition, the fewest acquisitions of a
// competitor over the most (share), and the handoff from the start of a
// release to the next acquisition by anyone (p50, p99); and the Locker's
// throughput and handoff p50 over each other group's (locker/x-acq/s above
// 1 and locker/x-handoff-p50 below 1 favour the Locker).
func compareContended(b *testing.B, phase int, groups func(b *testing.B, n int) []*contention) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("competitors=%d", n), func(b *testing.B) {
			gs := groups(b, n)
			runs := make([]func(), len(gs))
			for i, g := range gs {
				g.warm()
				runs[i] = func() { g.run(int64(phase)) }
			}
			b.ResetTimer()
			for i, done := 0, 0; done < b.N; i, done = i+1, done+phase {
				benchstats.Rotated(i, runs...)
			}
			b.StopTimer()
			for _, g := range gs {
				g.report()
			}
			for _, g := range gs[1:] {
				b.ReportMetric(gs[0].Throughput()/g.Throughput(), "locker/"+g.impl+"-acq/s")
				b.ReportMetric(float64(gs[0].HandoffP50())/float64(g.HandoffP50()), "locker/"+g.impl+"-handoff-p50")
			}
		})
	}
}

// BenchmarkPglockContended compares the Locker under contention on
// PostgreSQL with pglock polling every 1ms and every 10ms (see
// compareContended; the server's work is bytes of WAL). pglock under
// contention is slow (a few acquisitions per second with a 1ms poll on a
// 2-vCPU machine): run it with -benchtime 128x or 256x.
func BenchmarkPglockContended(b *testing.B) {
	d := dialectNamed(b, "PostgreSQL")
	compareContended(b, 128, func(b *testing.B, n int) []*contention {
		gs := []*contention{newContention(b, d, "locker", n, lockerClient(b, d))}
		for _, poll := range []time.Duration{pollInterval, 10 * pollInterval} {
			var g *contention
			g = newContention(b, d, "pglock-"+poll.String(), n, func(conns int, key string) benchstats.Take {
				c := newPglock(b, false, conns)
				return func(ctx context.Context) (func(context.Context) error, error) {
					lk, err := pglockTake(ctx, c, key, poll, &g.tries)
					if err != nil {
						return nil, err
					}
					return func(context.Context) error { return lk.Close() }, nil
				}
			})
			gs = append(gs, g)
		}
		return gs
	})
}

// On MariaDB the Locker is compared with github.com/sanketplus/go-mysql-lock,
// the Go library for a lock on MySQL: a named lock (GET_LOCK) held by a
// pooled connection that it keeps for the lock's life, pinged every second.
// It has no table, no lease and no fencing token; a waiter waits inside
// GET_LOCK on the server, queued, so it does not poll. Names are limited to
// 64 characters.
//
//	cd integration && go test -run '^$' -bench 'Lock/MariaDB' -benchtime 400x ./sqltable
//	cd integration && go test -run '^$' -bench MysqlLockContended -benchtime 1024x ./sqltable

// newMysqlLock opens a go-mysql-lock locker on a pool of its own of at
// most conns connections.
func newMysqlLock(b testing.TB, conns int) *gomysqllock.MysqlLocker {
	db := openDB(b, "mysql", testserver.MySQL(b).DSN())
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	return gomysqllock.NewMysqlLocker(db)
}

// mysqlLockTake takes name with l, waiting in GET_LOCK as go-mysql-lock
// does. Its Obtain waits with GET_LOCK's timeout -1, which MySQL takes for
// no limit and MariaDB refuses (GET_LOCK returns NULL, MDEV-4017), so on
// MariaDB a user must give a timeout: an hour here.
func mysqlLockTake(ctx context.Context, l *gomysqllock.MysqlLocker, name string) (*gomysqllock.Lock, error) {
	return l.ObtainTimeoutContext(ctx, name, 3600)
}

// BenchmarkMysqlLockContended compares the Locker under contention on
// MariaDB with go-mysql-lock (see compareContended; the server's work is
// statements run).
func BenchmarkMysqlLockContended(b *testing.B) {
	d := dialectNamed(b, "MariaDB")
	compareContended(b, 256, func(b *testing.B, n int) []*contention {
		return []*contention{
			newContention(b, d, "locker", n, lockerClient(b, d)),
			newContention(b, d, "mysql-lock", n, func(conns int, key string) benchstats.Take {
				l := newMysqlLock(b, conns)
				return func(ctx context.Context) (func(context.Context) error, error) {
					lk, err := mysqlLockTake(ctx, l, key)
					if err != nil {
						return nil, err
					}
					return func(context.Context) error { return lk.Release() }, nil
				}
			}),
		}
	})
}
