package sqltable_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"net/url"
	"testing"

	"cirello.io/pglock"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/sqltable"
)

// The benchmarks run the Locker and, in the same loop, the statements a
// careful user would write by hand (the seed's upsert that takes an expired
// lock, and a delete guarded by the owner; no token, no renewal, no
// waiting).

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

// take takes key with the upsert and returns its release, the delete
// guarded by the owner.
func (r *raw) take(ctx context.Context, key string) (func(context.Context) error, error) {
	owner := randomID()
	if r.mysql {
		res, err := r.lockS.ExecContext(ctx, key, owner)
		if err != nil {
			return nil, err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return nil, errors.New("raw lock not taken")
		}
	} else {
		var got string
		if err := r.lockS.QueryRowContext(ctx, key, owner).Scan(&got); err != nil {
			return nil, err
		}
	}
	return func(ctx context.Context) error {
		res, err := r.unlockS.ExecContext(ctx, key, owner)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errors.New("raw unlock deleted nothing")
		}
		return nil
	}, nil
}

// benchDB opens a pool of n connections on d, all opened before the timer.
func benchDB(b testing.TB, d dialect, n int) *sql.DB {
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

// rawDB is benchDB for the raw sides of BenchmarkLock: on SQLite with the
// pragmas sqltable.Open sets (WAL, synchronous=NORMAL), so that the raw
// statements and the Locker commit alike.
func rawDB(b testing.TB, d dialect, n int) *sql.DB {
	if d.name != "SQLite" {
		return benchDB(b, d, n)
	}
	db := openDB(b, "sqlite", sqliteFile(b)+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)")
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	return db
}

// BenchmarkLock runs the shared cases (conformance/benchmark) on each
// dialect: the Locker (contenders spread over up to 8 Lockers, each opened
// by URL on a pool of its own of six connections, like processes) and,
// uncontended, the raw upsert+delete on a pool of four (rawDB: on SQLite
// with the pragmas the Locker's URL sets), with context.Background() (raw) and with a
// cancellable context (raw-ctx). The Locker must stay interruptible by its
// Close, so its statements always carry a cancellable context; the drivers
// watch such a context on a goroutine per statement (go-sql-driver/mysql
// hands it to a watcher and back, modernc.org/sqlite starts one, pgx arms
// a watcher), which raw with Background skips and raw-ctx pays as well.
// Beside them: on PostgreSQL, uncontended, cirello.io/pglock on lib/pq
// (see newPglock; its FailIfLocked try); on MariaDB, in every case,
// sanketplus/go-mysql-lock (GET_LOCK, a waiter queued on the server).
//
//	cd integration && go test -run '^$' -bench '^BenchmarkLock$' -benchtime 400x ./sqltable
func BenchmarkLock(b *testing.B) {
	for _, d := range dialects {
		b.Run(d.name, func(b *testing.B) {
			benchmark.Run(b, benchmark.Harness{Sides: lockSides(d)})
		})
	}
}

// BenchmarkInstructions counts the client's instructions per uncontended
// Acquire+Release of BenchmarkLock's sides on each dialect (valgrind's
// callgrind, in child processes on the same servers; see
// benchmark.RunInstructions).
//
//	cd integration && go test -run '^$' -bench '^BenchmarkInstructions$' ./sqltable
func BenchmarkInstructions(b *testing.B) {
	for _, d := range dialects {
		b.Run(d.name, func(b *testing.B) {
			var env []string
			switch d.name {
			case "PostgreSQL":
				env = append(env, testserver.EnvPostgresDSN+"="+testserver.Postgres(b).DSN())
			case "MariaDB":
				env = append(env, testserver.EnvMySQLDSN+"="+testserver.MySQL(b).DSN())
			}
			benchmark.RunInstructions(b, benchmark.Instructions{Sides: lockSides(d), Env: env, Runs: 2})
		})
	}
}

// lockSides are BenchmarkLock's sides on dialect d.
func lockSides(d dialect) []benchmark.Side {
	rawSide := func(name string, cancellable bool) benchmark.Side {
		return benchmark.Side{Name: name, Floor: true, New: func(tb testing.TB, key string, _ int) benchmark.Lock {
			r := newRaw(tb, d, rawDB(tb, d, 4))
			return func(ctx context.Context) (func(context.Context) error, error) {
				if !cancellable {
					ctx = context.Background()
				}
				return r.take(ctx, key)
			}
		}}
	}
	sides := []benchmark.Side{
		benchmark.LockerSide("locker", 8, func(tb testing.TB) locker.Locker {
			return open(tb, d.url(tb, "", url.Values{"lock_max_conns": {"6"}}))
		}),
		rawSide("raw", false), rawSide("raw-ctx", true),
	}
	switch d.name {
	case "PostgreSQL":
		fenced := func(name string, notify bool) benchmark.Side {
			return benchmark.Side{Name: name, Floor: true, New: func(tb testing.TB, key string, _ int) benchmark.Lock {
				r := newRawFenced(tb, rawDB(tb, d, 4), notify)
				return func(ctx context.Context) (func(context.Context) error, error) { return r.take(ctx, key) }
			}}
		}
		sides = append(sides, fenced("raw-fenced", false), fenced("raw-fenced-notify", true))
		sides = append(sides, benchmark.Side{Name: "pglock", Floor: true, New: func(tb testing.TB, key string, _ int) benchmark.Lock {
			c := newPglock(tb, false, 4)
			return func(ctx context.Context) (func(context.Context) error, error) {
				lk, err := c.AcquireContext(ctx, key, pglock.FailIfLocked())
				if err != nil {
					return nil, err
				}
				return func(context.Context) error { return lk.Close() }, nil
			}
		}})
	case "MariaDB":
		sides = append(sides, benchmark.Side{Name: "mysql-lock", New: func(tb testing.TB, key string, _ int) benchmark.Lock {
			l := newMysqlLock(tb, 2)
			sum := sha256.Sum256([]byte(key)) // names are limited to 64 characters
			name := hex.EncodeToString(sum[:16])
			return func(ctx context.Context) (func(context.Context) error, error) {
				lk, err := mysqlLockTake(ctx, l, name)
				if err != nil {
					return nil, err
				}
				return func(context.Context) error { return lk.Release() }, nil
			}
		}})
	}
	return sides
}

// rawFenced is the fenced floor of the lock table on PostgreSQL: the
// Locker's own upsert (a row kept per key, its token raised on every
// take) and an update that frees the row, guarded by owner and token,
// with no renewal, queue or waiting; with notify the release also
// notifies a channel, as the Locker's does (pg_notify in the statement).
type rawFenced struct {
	lockS, unlockS *sql.Stmt
	notify         bool
}

func newRawFenced(tb testing.TB, db *sql.DB, notify bool) *rawFenced {
	tb.Helper()
	const now = "(extract(epoch from now()) * 1000000)::bigint"
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS bench_fenced (lock_key text PRIMARY KEY, owner text NOT NULL, token bigint NOT NULL, expires_us bigint NOT NULL)`); err != nil {
		tb.Fatalf("raw-fenced DDL: %v", err)
	}
	lock := `INSERT INTO bench_fenced AS l (lock_key, owner, token, expires_us)
VALUES ($1, $2, ` + now + `, ` + now + ` + 30000000)
ON CONFLICT (lock_key) DO UPDATE
SET owner = excluded.owner, token = GREATEST(l.token + 1, excluded.token), expires_us = excluded.expires_us
WHERE l.expires_us <= excluded.token OR l.owner = ''
RETURNING l.token`
	unlock := `UPDATE bench_fenced SET owner = '', expires_us = ` + now + `
WHERE lock_key = $1 AND owner = $2 AND token = $3 AND expires_us > ` + now
	if notify {
		unlock = `WITH r AS (` + unlock + ` RETURNING lock_key)
SELECT pg_notify('bench_fenced', $2 || ':' || lock_key) FROM r`
	}
	r := &rawFenced{notify: notify}
	var err error
	if r.lockS, err = db.Prepare(lock); err != nil {
		tb.Fatal(err)
	}
	if r.unlockS, err = db.Prepare(unlock); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.lockS.Close(); r.unlockS.Close() })
	return r
}

func (r *rawFenced) take(ctx context.Context, key string) (func(context.Context) error, error) {
	owner := randomID()
	var token int64
	if err := r.lockS.QueryRowContext(ctx, key, owner).Scan(&token); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		if r.notify {
			var s string
			return r.unlockS.QueryRowContext(ctx, key, owner, token).Scan(&s)
		}
		res, err := r.unlockS.ExecContext(ctx, key, owner, token)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errors.New("raw-fenced unlock freed nothing")
		}
		return nil
	}, nil
}

var _ locker.Handle = (*sqltable.Handle)(nil)
