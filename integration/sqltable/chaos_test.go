package sqltable_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/chaos"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/sqltable"
)

// chaosURLEnv hands each chaos worker process the URL it opens its Locker
// with: the private server, through that worker's own fault proxy.
const chaosURLEnv = "LOCKER_TEST_SQLTABLE_CHAOS_URL"

// chaosTTL is the lease of the chaos runs; renewals run every TTL/3.
const chaosTTL = 2 * time.Second

// chaosDialect is a server dialect of the chaos run. (SQLite, which has no
// server to pause or link to cut, runs under the holder pause in
// conformance/chaos's own tests.)
type chaosDialect struct {
	name  string
	start func(t testing.TB) *testserver.Server
	// url returns the sqltable URL of srv through addr.
	url func(t testing.TB, srv *testserver.Server, addr string) string
	// durable makes the server's commits survive a kill of its process
	// (the test servers trade that for speed); run at start and after
	// every restart.
	durable func(t testing.TB, srv *testserver.Server)
}

var chaosDialects = []chaosDialect{
	{
		name:  "PostgreSQL",
		start: testserver.NewPostgres,
		url: func(t testing.TB, srv *testserver.Server, addr string) string {
			u, err := url.Parse(srv.DSN())
			if err != nil {
				t.Fatal(err)
			}
			u.Scheme, u.Host = sqltable.SchemePostgres, addr
			return u.String()
		},
		durable: pgDurable,
	},
	{
		name:  "MariaDB",
		start: testserver.NewMySQL,
		url: func(t testing.TB, srv *testserver.Server, addr string) string {
			user, pass, db := mysqlCreds(t, srv.DSN())
			return (&url.URL{Scheme: sqltable.SchemeMySQL, User: url.UserPassword(user, pass), Host: addr, Path: "/" + db}).String()
		},
		durable: mysqlDurable,
	},
}

// pgDurable turns synchronous_commit back on for the database (the test
// servers run with it off): otherwise a killed server forgets the commits
// of its last fraction of a second, an acquisition or renewal among them.
// The setting is the database's, so it survives restarts. fsync=off does
// not matter here: a killed container's writes are in the host's page
// cache, which survives.
func pgDurable(t testing.TB, srv *testserver.Server) {
	t.Helper()
	db := openDB(t, "pgx", srv.DSN())
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatalf("connect to %s: %v", srv, err)
	}
	defer conn.Close()
	// The ALTER's own commit is synchronous, so that it survives the first
	// kill.
	for _, q := range []string{"SET synchronous_commit = on", "ALTER DATABASE locker SET synchronous_commit = on"} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// mysqlDurable sets innodb_flush_log_at_trx_commit to 1 (the test servers
// run with 0: the log is written once a second, and a killed server loses
// that second's commits). It is a global variable that a restart sets back
// from the command line, so it is set again after every restart, before the
// restart fault ends: commits made in the moment between are flushed within
// a second, long before the next kill can come.
func mysqlDurable(t testing.TB, srv *testserver.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsns := []string{srv.DSN()}
	if user, pass, _ := mysqlCreds(t, srv.DSN()); user != "root" {
		// The official image grants its user one database only; its root
		// has the same password.
		dsns = append(dsns, "root:"+pass+"@"+strings.SplitN(srv.DSN(), "@", 2)[1])
	}
	var last error
	for _, dsn := range dsns {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		_, last = db.ExecContext(ctx, "SET GLOBAL innodb_flush_log_at_trx_commit = 1")
		if last == nil {
			var v int
			if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.innodb_flush_log_at_trx_commit").Scan(&v); err != nil || v != 1 {
				t.Fatalf("innodb_flush_log_at_trx_commit = %d, %v; want 1", v, err)
			}
		}
		db.Close()
		if last == nil {
			return
		}
	}
	t.Fatalf("SET GLOBAL innodb_flush_log_at_trx_commit = 1: %v", last)
}

// chaosBed is a run's test bed: a private server the nemesis pauses and
// kills, and one fault proxy per worker. It is made in the test process, at
// the first WorkerEnv call: the worker processes run the test function too,
// and must not start servers of their own.
type chaosBed struct {
	d     chaosDialect
	mu    sync.Mutex
	srv   *testserver.Server
	links testserver.ChaosLinks
}

func (b *chaosBed) server(t *testing.T) *testserver.Server {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.srv == nil {
		srv := b.d.start(t)
		if !srv.CanControl() {
			t.Skipf("the chaos run pauses, kills and restarts its server; %s cannot be", srv)
		}
		b.d.durable(t, srv)
		b.srv = srv
	}
	return b.srv
}

func (b *chaosBed) current() *testserver.Server {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.srv
}

// TestChaos runs the lock table on PostgreSQL and MariaDB under the chaos
// suite: worker processes lock, write to a fenced register and release
// while the nemesis stops holder processes (SIGSTOP) past their lease,
// pauses the server (docker pause), kills it and starts it again, and
// partitions, slows or blackholes (then resets) one worker's link. The
// locks are leases on the database's clock: a holder cut off from the
// database (its link, or the whole server, paused) gives its lock up by
// its own clock before the database lets anyone else in; a frozen holder's
// lease runs out and the register's fencing stops its late writes; the
// rows survive a restart (commits made durable, see pgDurable and
// mysqlDurable), and a restart longer than the lease ends every lock.
//
// LOCKER_CHAOS_DURATION lengthens the runs for a soak; LOCKER_CHAOS_SEED
// replays a failed run's faults.
func TestChaos(t *testing.T) { runChaos(t, chaos.Family{}) }

// TestChaosSemaphore and TestChaosReadWrite are TestChaos for the lock
// families, with the same faults, for 20s (room for at least one fault before the
// last 4 TTL, which are fault-free).
func TestChaosSemaphore(t *testing.T) { runChaos(t, chaos.Semaphore(2)) }
func TestChaosReadWrite(t *testing.T) { runChaos(t, chaos.ReadWrite()) }

func runChaos(t *testing.T, f chaos.Family) {
	duration := time.Duration(0) // the suite's default
	if f != (chaos.Family{}) {
		duration = 20 * time.Second
	}
	for _, d := range chaosDialects {
		t.Run(d.name, func(t *testing.T) {
			bed := &chaosBed{d: d}
			r := chaos.Run(t, chaos.Harness{
				Family:   f,
				Duration: duration,
				TTL:      chaosTTL,
				WorkerEnv: func(t *testing.T, w int) []string {
					srv := bed.server(t)
					pxAddr := bed.links.Add(t, w, srv.Addr())[0]
					return []string{chaosURLEnv + "=" + d.url(t, srv, pxAddr)}
				},
				NewLocker: func(t *testing.T, w chaos.Worker) locker.Locker {
					// The MySQL driver logs every connection the faults
					// break; the run counts them as errors of the calls.
					_ = mysql.SetLogger(log.New(io.Discard, "", 0))
					raw := w.Env(chaosURLEnv)
					if raw == "" {
						t.Fatalf("worker %d: %s is not set", w.Index, chaosURLEnv)
					}
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					l, err := sqltable.Open(ctx, raw)
					if err != nil {
						t.Fatalf("worker %d: sqltable.Open: %v", w.Index, err)
					}
					return l
				},
				Faults: append(testserver.ServerFaults(bed.current, func(t *testing.T, s *testserver.Server) { d.durable(t, s) }), bed.links.Faults()...),
			})
			if r == nil {
				return // a worker process
			}
			if len(r.Violations) > 0 {
				dumpLockTables(t, d, bed.current())
			}
			faults := 0
			for _, n := range r.Faults {
				faults += n
			}
			if r.Acquired == 0 || r.Writes == 0 || faults == 0 {
				t.Errorf("the run exercised too little: %v", r)
			}
		})
	}
}

// dumpLockTables logs the rows of the lock tables (the mutex's and the
// families'), with the database's clock, after a run with violations: what
// held the keys nobody could take.
func dumpLockTables(t *testing.T, d chaosDialect, srv *testserver.Server) {
	driver, dsn, now := "pgx", srv.DSN(), "SELECT clock_timestamp()::text"
	if d.name != "PostgreSQL" {
		driver, now = "mysql", "SELECT CAST(NOW(6) AS CHAR)"
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Logf("dump: %v", err)
		return
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var clock string
	if err := db.QueryRowContext(ctx, now).Scan(&clock); err != nil {
		t.Logf("dump: the database's clock: %v", err)
	}
	t.Logf("dump: the database's clock: %s", clock)
	for _, table := range []string{sqltable.DefaultTable, sqltable.DefaultTable + "_fam"} {
		rows, err := db.QueryContext(ctx, "SELECT * FROM "+table)
		if err != nil {
			t.Logf("dump %s: %v", table, err)
			continue
		}
		cols, _ := rows.Columns()
		var out []string
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Logf("dump %s: %v", table, err)
				break
			}
			var fields []string
			for i, c := range cols {
				v := vals[i]
				if b, ok := v.([]byte); ok {
					v = string(b)
				}
				fields = append(fields, fmt.Sprintf("%s=%v", c, v))
			}
			out = append(out, strings.Join(fields, " "))
		}
		rows.Close()
		t.Logf("dump %s (%d rows):\n%s", table, len(out), strings.Join(out, "\n"))
	}
}
