package sqltable_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/sqltable"
)

// pgURLFrom is pgURL on the server and credentials of dsn.
func pgURLFrom(t testing.TB, dsn, addr string, extra url.Values) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Scheme = sqltable.SchemePostgres
	if addr != "" {
		u.Host = addr
	}
	q := u.Query()
	for k, v := range extra {
		q[k] = v
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// mysqlURLAs is a mysql:// URL for user on db at addr.
func mysqlURLAs(user, pass, addr, db string, extra url.Values) string {
	u := url.URL{Scheme: sqltable.SchemeMySQL, User: url.UserPassword(user, pass), Host: addr, Path: "/" + db, RawQuery: extra.Encode()}
	return u.String()
}

func with(extra url.Values, more url.Values) url.Values {
	out := url.Values{}
	for k, v := range more {
		out[k] = v
	}
	for k, v := range extra {
		out[k] = v
	}
	return out
}

// The TLS dialects: the servers of testserver.PostgresTLS and MySQLTLS,
// which take TCP connections only over TLS; the Lockers verify the
// server's certificate against the test CA (sslmode=verify-full with
// sslrootcert; lock_tls_ca).
var (
	pgTLS = dialect{
		name: "PostgreSQL/TLS",
		url: func(t testing.TB, addr string, extra url.Values) string {
			return pgURLFrom(t, testserver.PostgresTLS(t).DSN(), addr, extra)
		},
		addr:   func(t testing.TB) string { return testserver.PostgresTLS(t).Addr() },
		admin:  func(t testing.TB) *sql.DB { return openDB(t, "pgx", testserver.PostgresTLS(t).DSN()) },
		ph:     func(n int) string { return fmt.Sprintf("$%d", n) },
		warmUp: true,
	}
	mysqlTLS = dialect{
		name: "MariaDB/TLS",
		url: func(t testing.TB, addr string, extra url.Values) string {
			srv := testserver.MySQLTLS(t)
			if addr == "" {
				addr = srv.Addr()
			}
			user, pass, db := mysqlCreds(t, srv.DSN())
			return mysqlURLAs(user, pass, addr, db, with(extra, url.Values{"lock_tls_ca": {srv.TLS().CAFile}}))
		},
		addr:  func(t testing.TB) string { return testserver.MySQLTLS(t).Addr() },
		admin: func(t testing.TB) *sql.DB { return openDB(t, "mysql", testserver.MySQLTLS(t).DSN()) },
		ph:    func(int) string { return "?" },
	}
)

// TestConformanceTLS runs the suite (testserver.SecurityCases; all with
// LOCKER_CONFORMANCE_FULL=1) over TLS verified against a test
// CA: postgres+table:// with sslmode=verify-full, mysql:// with lock_tls_ca.
func TestConformanceTLS(t *testing.T) {
	for _, d := range []dialect{pgTLS, mysqlTLS} {
		d.only = testserver.SecurityCases
		t.Run(d.name, func(t *testing.T) { runServerConformance(t, d) })
	}
}

// TestTLSFailures: a wrong CA, a wrong password and no TLS each fail the
// first call, saying why, and no error shows the password.
func TestTLSFailures(t *testing.T) {
	const wrongPassword = "Wr0ng-pa55word-7d1f"
	other := testserver.NewTLSFiles(t) // a CA that did not sign the servers' certificates
	t.Run("PostgreSQL", func(t *testing.T) {
		srv := testserver.PostgresTLS(t)
		base := pgURLFrom(t, srv.DSN(), "", nil)
		u, _ := url.Parse(base)
		user := u.User.Username()
		pass, _ := u.User.Password()
		u.User = url.UserPassword(user, wrongPassword)
		checkFailures(t, []string{pass, wrongPassword}, []failure{
			{"wrong CA", pgURLFrom(t, srv.DSN(), "", url.Values{"sslrootcert": {other.CAFile}}), "certificate signed by unknown authority"},
			{"wrong password", u.String(), "password authentication failed"},
			{"no TLS", pgURLFrom(t, srv.DSN(), "", url.Values{"sslmode": {"disable"}}), "no encryption"},
		})
	})
	t.Run("MariaDB", func(t *testing.T) {
		srv := testserver.MySQLTLS(t)
		user, pass, db := mysqlCreds(t, srv.DSN())
		ca := url.Values{"lock_tls_ca": {srv.TLS().CAFile}}
		checkFailures(t, []string{wrongPassword}, []failure{
			{"wrong CA", mysqlURLAs(user, pass, srv.Addr(), db, url.Values{"lock_tls_ca": {other.CAFile}}), "certificate signed by unknown authority"},
			{"wrong password", mysqlURLAs(user, wrongPassword, srv.Addr(), db, ca), "Access denied for user"},
			{"no TLS", mysqlURLAs(user, pass, srv.Addr(), db, nil), "Error 1045"},
		})
	})
}

type failure struct{ name, url, want string }

func checkFailures(t *testing.T, secrets []string, cases []failure) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t)
			l := open(t, c.url)
			h, err := l.TryAcquire(ctx, testKey(t, ""))
			if err == nil {
				_ = h.Release(ctx)
				t.Fatal("TryAcquire succeeded")
			}
			if errors.Is(err, locker.ErrNotAcquired) {
				t.Fatalf("TryAcquire: %v; want the connection's failure, not ErrNotAcquired", err)
			}
			msg := err.Error()
			t.Logf("the error: %s", msg)
			if !strings.Contains(msg, c.want) {
				t.Errorf("error %q does not say %q", msg, c.want)
			}
			for _, s := range secrets {
				if s != "" && len(s) > 6 && strings.Contains(msg, s) {
					t.Errorf("error %q shows the password %q", msg, s)
				}
			}
		})
	}
}

// privileges are the rights a least-privilege user gets.
type privileges struct {
	locks, fam string // on the lock table and the families table
	meta       string // on the meta table
}

// minimal are the rights doc.go names: SELECT, INSERT and UPDATE on the
// lock table (DELETE only for Prune), SELECT, INSERT, UPDATE and DELETE on
// the families table, SELECT on the meta table.
// On MySQL/MariaDB also UPDATE on the meta table, where the Locker checks
// the connection's affected-rows mode with an UPDATE that changes nothing.
var minimal = privileges{locks: "SELECT, INSERT, UPDATE", fam: "SELECT, INSERT, UPDATE, DELETE", meta: "SELECT"}

func minimalFor(mysql bool) privileges {
	p := minimal
	if mysql {
		p.meta = "SELECT, UPDATE"
	}
	return p
}

// minDB is a database of its own with the tables made by the admin, and a
// user that has only the given rights there.
type minDB struct {
	d      dialect // Lockers connect as the user, with ddl=false; admin is the superuser
	name   string  // the database
	user   string
	secret string
}

// newPGMinDB makes a PostgreSQL database where PUBLIC has no rights, the
// tables, and a role with LOGIN, CONNECT, USAGE on schema public and p.
func newPGMinDB(t *testing.T, p privileges) *minDB {
	t.Helper()
	srv := testserver.Postgres(t)
	ctx := testCtx(t)
	root := openDB(t, "pgx", srv.DSN())
	n := time.Now().UnixNano()
	name, role, secret := fmt.Sprintf("locker_min_%d", n), fmt.Sprintf("locker_min_%d", n), fmt.Sprintf("S3cret-%x", n)
	mustExec(t, ctx, root, "CREATE DATABASE "+name)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := root.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database: %v", err)
		}
		_, _ = root.ExecContext(ctx, "DROP ROLE IF EXISTS "+role)
	})
	mustExec(t, ctx, root, "REVOKE ALL ON DATABASE "+name+" FROM PUBLIC")
	mustExec(t, ctx, root, "CREATE ROLE "+role+" LOGIN PASSWORD '"+secret+"'")
	mustExec(t, ctx, root, "GRANT CONNECT ON DATABASE "+name+" TO "+role)
	u, _ := url.Parse(srv.DSN())
	u.Path = "/" + name
	admin := openDB(t, "pgx", u.String())
	mustExec(t, ctx, admin, "REVOKE ALL ON SCHEMA public FROM PUBLIC")
	mustExec(t, ctx, admin, "GRANT USAGE ON SCHEMA public TO "+role)
	createTables(t, ctx, admin, sqltable.PostgreSQL)
	grantTables(t, ctx, admin, p, `"`, role)
	return rebuildMinDB(t, false, name, role, secret)
}

// rebuildMinDB is the minDB of a database and user that exist.
func rebuildMinDB(t *testing.T, mysql bool, name, user, secret string) *minDB {
	if mysql {
		srv := testserver.MySQL(t)
		rootUser, rootPass, _ := mysqlCreds(t, srv.DSN())
		adminDSN := fmt.Sprintf("%s:%s@tcp(%s)/%s", rootUser, rootPass, srv.Addr(), name)
		return &minDB{name: name, user: user, secret: secret, d: dialect{
			name: "MariaDB/least-privilege",
			url: func(t testing.TB, addr string, extra url.Values) string {
				if addr == "" {
					addr = srv.Addr()
				}
				return mysqlURLAs(user, secret, addr, name, with(extra, url.Values{"ddl": {"false"}}))
			},
			addr:  func(t testing.TB) string { return srv.Addr() },
			admin: func(t testing.TB) *sql.DB { return openDB(t, "mysql", adminDSN) },
			ph:    func(int) string { return "?" },
		}}
	}
	srv := testserver.Postgres(t)
	u, _ := url.Parse(srv.DSN())
	u.Path = "/" + name
	adminDSN := u.String()
	u.User = url.UserPassword(user, secret)
	userDSN := u.String()
	return &minDB{name: name, user: user, secret: secret, d: dialect{
		name: "PostgreSQL/least-privilege",
		url: func(t testing.TB, addr string, extra url.Values) string {
			return pgURLFrom(t, userDSN, addr, with(extra, url.Values{"ddl": {"false"}}))
		},
		addr:   func(t testing.TB) string { return srv.Addr() },
		admin:  func(t testing.TB) *sql.DB { return openDB(t, "pgx", adminDSN) },
		ph:     func(n int) string { return fmt.Sprintf("$%d", n) },
		warmUp: true,
	}}
}

// newMySQLMinDB makes a MariaDB database with the tables, and a user that
// has p on them and nothing else.
func newMySQLMinDB(t *testing.T, p privileges) *minDB {
	t.Helper()
	srv := testserver.MySQL(t)
	srv.GrantOption(t)
	ctx := testCtx(t)
	root := openDB(t, "mysql", srv.DSN())
	n := time.Now().UnixNano()
	name, user, secret := fmt.Sprintf("locker_min_%d", n), fmt.Sprintf("lmin_%d", n%1e12), fmt.Sprintf("S3cret-%x", n)
	mustExec(t, ctx, root, "CREATE DATABASE "+name)
	mustExec(t, ctx, root, "CREATE USER '"+user+"'@'%' IDENTIFIED BY '"+secret+"'")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = root.ExecContext(ctx, "DROP USER IF EXISTS '"+user+"'@'%'")
		if _, err := root.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Errorf("drop database: %v", err)
		}
	})
	rootUser, rootPass, _ := mysqlCreds(t, srv.DSN())
	adminDSN := fmt.Sprintf("%s:%s@tcp(%s)/%s", rootUser, rootPass, srv.Addr(), name)
	admin := openDB(t, "mysql", adminDSN)
	createTables(t, ctx, admin, sqltable.MySQL)
	grantTables(t, ctx, admin, p, "`", "'"+user+"'@'%'")
	return rebuildMinDB(t, true, name, user, secret)
}

func createTables(t *testing.T, ctx context.Context, db *sql.DB, d sqltable.Dialect) {
	t.Helper()
	ddl, err := sqltable.DDL(d, sqltable.DefaultTable)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ddl {
		mustExec(t, ctx, db, s)
	}
}

func grantTables(t *testing.T, ctx context.Context, db *sql.DB, p privileges, quote, grantee string) {
	t.Helper()
	for suffix, privs := range map[string]string{"": p.locks, "_fam": p.fam, "_meta": p.meta} {
		if privs != "" {
			mustExec(t, ctx, db, "GRANT "+privs+" ON "+quote+sqltable.DefaultTable+suffix+quote+" TO "+grantee)
		}
	}
}

func mustExec(t *testing.T, ctx context.Context, db *sql.DB, s string) {
	t.Helper()
	if _, err := db.ExecContext(ctx, s); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
}

// TestConformanceLeastPrivilege runs the suite (testserver.SecurityCases), with ddl=false, as a
// user with only the rights doc.go lists: on PostgreSQL LOGIN, CONNECT on
// the database, USAGE on the schema (in a database where PUBLIC has none
// of them); on both, SELECT, INSERT and UPDATE on the lock table, SELECT,
// INSERT, UPDATE and DELETE on the families table, SELECT on the meta
// table.
func TestConformanceLeastPrivilege(t *testing.T) {
	for _, c := range []struct {
		name string
		mk   func(t *testing.T) dialect
	}{
		{"PostgreSQL", func(t *testing.T) dialect { return inheritedMinDB(t, newPGMinDB, false).d }},
		{"MariaDB", func(t *testing.T) dialect { return inheritedMinDB(t, newMySQLMinDB, true).d }},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := c.mk(t)
			d.only = testserver.SecurityCases
			runServerConformance(t, d)
		})
	}
}

// inheritedMinDB makes the least-privilege database of a conformance run,
// or in one of the suite's child processes (the Process cases run the test
// again) takes the parent's: the same database and user.
func inheritedMinDB(t *testing.T, mk func(*testing.T, privileges) *minDB, mysql bool) *minDB {
	env := "LOCKER_TEST_SQLTABLE_MINDB_" + strings.ToUpper(strings.ReplaceAll(t.Name(), "/", "_"))
	if v := os.Getenv(env); v != "" {
		f := strings.Fields(v)
		return rebuildMinDB(t, mysql, f[0], f[1], f[2])
	}
	db := mk(t, minimalFor(mysql))
	t.Setenv(env, db.name+" "+db.user+" "+db.secret)
	return db
}

// TestLeastPrivilegeMissingRight: a user that lacks one of those rights
// fails its first call that needs it (a TryAcquire, or with the lock
// table's rights whole, its first family call; Prune for DELETE on the
// lock table) with the server's refusal naming the table, wrapped with
// what the Locker was doing.
func TestLeastPrivilegeMissingRight(t *testing.T) {
	drop := func(privs, right string) string {
		var out []string
		for _, p := range strings.Split(privs, ", ") {
			if p != right {
				out = append(out, p)
			}
		}
		return strings.Join(out, ", ")
	}
	type rightCase struct {
		name  string
		p     privileges
		first func(ctx context.Context, l *sqltable.Locker, key string, db *minDB) error
	}
	cases := func(mysql bool) []rightCase {
		var cases []rightCase
		for _, r := range []string{"SELECT", "INSERT", "UPDATE"} {
			p := minimalFor(mysql)
			p.locks = drop(p.locks, r)
			cases = append(cases, rightCase{"lock table without " + r, p, mutexFirst})
		}
		for _, r := range []string{"SELECT", "INSERT", "UPDATE", "DELETE"} {
			p := minimalFor(mysql)
			p.fam = drop(p.fam, r)
			cases = append(cases, rightCase{"families table without " + r, p, semaphoreFirst})
		}
		for _, r := range strings.Split(minimalFor(mysql).meta, ", ") {
			p := minimalFor(mysql)
			p.meta = drop(p.meta, r)
			cases = append(cases, rightCase{"meta table without " + r, p, mutexFirst})
		}
		// DELETE on the lock table is for Prune alone; an old row makes
		// sure that Prune has something to delete.
		cases = append(cases, rightCase{"lock table without DELETE, Prune", minimalFor(mysql), func(ctx context.Context, l *sqltable.Locker, key string, db *minDB) error {
			if err := mutexFirst(ctx, l, key, db); err != nil {
				return fmt.Errorf("the mutex failed without DELETE: %w", err)
			}
			mustExec(t, ctx, db.d.admin(t), "INSERT INTO "+db.d.table("")+" (lock_key, owner, token, expires_us) VALUES ('old', '', 1, 1)")
			_, err := l.Prune(ctx, time.Minute)
			return err
		}})
		return cases
	}
	for _, mk := range []struct {
		name string
		new  func(*testing.T, privileges) *minDB
	}{{"PostgreSQL", newPGMinDB}, {"MariaDB", newMySQLMinDB}} {
		t.Run(mk.name, func(t *testing.T) {
			for _, c := range cases(mk.name == "MariaDB") {
				t.Run(c.name, func(t *testing.T) {
					db := mk.new(t, c.p)
					ctx := testCtx(t)
					l := open(t, db.d.url(t, "", nil))
					key := testKey(t, "")
					err := c.first(ctx, l, key, db)
					if err == nil {
						t.Fatal("the first calls succeeded without the right")
					}
					msg := err.Error()
					t.Logf("the error: %s", msg)
					for _, w := range []string{"denied", sqltable.DefaultTable} {
						if !strings.Contains(msg, w) {
							t.Errorf("error %q does not say %q", msg, w)
						}
					}
					if strings.Contains(msg, db.secret) {
						t.Errorf("error %q shows the password", msg)
					}
				})
			}
		})
	}
}

// mutexFirst is what a program does first: TryAcquire and Release.
func mutexFirst(ctx context.Context, l *sqltable.Locker, key string, _ *minDB) error {
	h, err := l.TryAcquire(ctx, key)
	if err != nil {
		return err
	}
	return h.Release(ctx)
}

// semaphoreFirst is a program's first semaphore call and its release.
func semaphoreFirst(ctx context.Context, l *sqltable.Locker, key string, _ *minDB) error {
	h, err := l.TryAcquireSemaphore(ctx, key, 2)
	if err != nil {
		return err
	}
	return h.Release(ctx)
}
