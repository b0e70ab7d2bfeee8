package sqltable_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/sqltable"
)

// isUnsafe reports an error that refuses an unsafe configuration.
func isUnsafe(err error) bool { return errors.Is(err, locker.ErrUnsafeConfig) }

// expectRefused builds a Locker with newLocker and checks that the
// configuration is refused, at construction or at the first TryAcquire,
// with an error wrapping locker.ErrUnsafeConfig and, when option is
// given, locker.ErrInvalidOption or locker.ErrInvalidURL, whose text names
// mention. When it is accepted it builds a second one, as another process
// would, and says whether both hold one key.
func expectRefused(t *testing.T, mention string, option bool, newLocker func(t *testing.T) (locker.Locker, error)) {
	t.Helper()
	ctx := testCtx(t)
	k := testKey(t, "")
	l1, err := newLocker(t)
	var h1 locker.Handle
	if err == nil {
		h1, err = l1.TryAcquire(ctx, k)
	}
	if err == nil {
		defer h1.Release(ctx)
		l2, err2 := newLocker(t)
		if err2 == nil {
			var h2 locker.Handle
			if h2, err2 = l2.TryAcquire(ctx, k); err2 == nil {
				defer h2.Release(ctx)
				t.Fatalf("accepted, and two Lockers both hold %q (tokens %d and %d); want a refusal naming %s", k, h1.Token(), h2.Token(), mention)
			}
		}
		t.Fatalf("accepted: the first Locker holds %q (the second: %v); want a refusal naming %s", k, err2, mention)
	}
	if !isUnsafe(err) {
		t.Errorf("refused with %v; want an error wrapping locker.ErrUnsafeConfig", err)
	}
	if option && !errors.Is(err, locker.ErrInvalidOption) && !errors.Is(err, locker.ErrInvalidURL) {
		t.Errorf("refused with %v; want it to wrap locker.ErrInvalidOption or locker.ErrInvalidURL", err)
	}
	if !strings.Contains(err.Error(), mention) {
		t.Errorf("refused with %q; want it to name %s", err, mention)
	}
	t.Logf("refused: %v", err)
}

// openErr opens a Locker from raw, closed at the end of the test.
func openErr(t *testing.T, raw string) (locker.Locker, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := sqltable.Open(ctx, raw)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { l.Close() })
	return l, nil
}

// TestTemporarySchemaRefused: a lock table in a temporary schema is a table
// per connection, so every Locker (every process) would hold every key at
// once. SQLite's temp, PostgreSQL's pg_temp (any case) and pg_temp_N are
// refused, through a URL's lock_table and through WithTable, and so is a
// PostgreSQL search_path that puts pg_temp first when the table does not
// exist elsewhere (CREATE TABLE would make it a temporary table). Each
// Locker has a pool of one connection, so that without the refusal each
// would have one table of its own.
func TestTemporarySchemaRefused(t *testing.T) {
	one := url.Values{"lock_max_conns": {"1"}}
	with := func(v url.Values, k, val string) url.Values {
		out := url.Values{}
		for a, b := range v {
			out[a] = b
		}
		out.Set(k, val)
		return out
	}
	for _, tc := range []struct {
		dialect, name, mention string
		option                 bool
		extra                  url.Values
	}{
		{"SQLite", "lock_table=temp.locks", "lock_table", true, with(one, "lock_table", "temp.locks")},
		{"SQLite", "lock_table=TEMP.locks", "lock_table", true, with(one, "lock_table", "TEMP.locks")},
		{"PostgreSQL", "lock_table=pg_temp.locks", "lock_table", true, with(one, "lock_table", "pg_temp.locks")},
		{"PostgreSQL", "lock_table=Pg_Temp.locks", "lock_table", true, with(one, "lock_table", "Pg_Temp.locks")},
		{"PostgreSQL", "lock_table=pg_temp_3.locks", "lock_table", true, with(one, "lock_table", "pg_temp_3.locks")},
		{"PostgreSQL", "search_path=pg_temp,public", "search_path", false,
			with(with(one, "search_path", "pg_temp,public"), "lock_table", fmt.Sprintf("tmp_first_%d", time.Now().UnixNano()))},
	} {
		t.Run(tc.dialect+"/"+tc.name, func(t *testing.T) {
			d := dialectNamed(t, tc.dialect)
			raw := d.url(t, "", tc.extra)
			expectRefused(t, tc.mention, tc.option, func(t *testing.T) (locker.Locker, error) { return openErr(t, raw) })
		})
	}
	// The same through New and WithTable: the error names the option.
	t.Run("SQLite/WithTable", func(t *testing.T) {
		d := dialects[0]
		expectRefused(t, "WithTable", true, func(t *testing.T) (locker.Locker, error) {
			db := openDB(t, "sqlite", sqliteFile(t)+"?_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)")
			db.SetMaxOpenConns(1)
			l := sqltable.New(db, sqltable.WithTable("temp.locks"))
			t.Cleanup(func() { l.Close() })
			_ = d
			return l, l.Err()
		})
	})
	t.Run("PostgreSQL/WithTable", func(t *testing.T) {
		expectRefused(t, "WithTable", true, func(t *testing.T) (locker.Locker, error) {
			db := openDB(t, "pgx", testserver.Postgres(t).DSN())
			db.SetMaxOpenConns(1)
			l := sqltable.New(db, sqltable.WithTable("pg_temp.locks"))
			t.Cleanup(func() { l.Close() })
			return l, l.Err()
		})
	})
}

// TestTemporaryFirstUsesPermanentTable: with pg_temp first in search_path
// and the lock table already in public, every Locker uses public's table:
// CREATE TABLE IF NOT EXISTS of the unqualified name would otherwise make a
// temporary table of the same name on the first connection, which shadows
// the real one there.
func TestTemporaryFirstUsesPermanentTable(t *testing.T) {
	d := dialectNamed(t, "PostgreSQL")
	ctx := testCtx(t)
	table := fmt.Sprintf("tmp_then_public_%d", time.Now().UnixNano())
	base := open(t, d.url(t, "", url.Values{"lock_table": {table}}))
	k := testKey(t, "")
	h0 := mustAcquire(t, ctx, base, k) // creates public's table
	mustRelease(t, ctx, h0)
	extra := url.Values{"lock_table": {table}, "search_path": {"pg_temp,public"}, "lock_max_conns": {"1"}}
	a, b := open(t, d.url(t, "", extra)), open(t, d.url(t, "", extra))
	h := mustAcquire(t, ctx, a, k)
	defer h.Release(ctx)
	if h2, err := b.TryAcquire(ctx, k); err == nil {
		h2.Release(ctx)
		t.Fatalf("two Lockers with search_path=pg_temp,public both hold %q", k)
	} else if !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("second TryAcquire: %v, want ErrNotAcquired", err)
	}
	if h3, err := base.TryAcquire(ctx, k); err == nil {
		h3.Release(ctx)
		t.Fatalf("a Locker with the default search_path holds %q too", k)
	}
}

// TestSearchPathResolvesOnce: an unqualified table name whose search_path
// starts with a schema that has no lock table (a "$user" schema, say) uses
// the table the name resolves to, public's, as a Locker with the default
// search_path does; it does not create a second table in the first
// schema.
func TestSearchPathResolvesOnce(t *testing.T) {
	d := dialectNamed(t, "PostgreSQL")
	ctx := testCtx(t)
	admin := d.admin(t)
	schema := fmt.Sprintf("sp_%d", time.Now().UnixNano())
	if _, err := admin.ExecContext(ctx, `CREATE SCHEMA "`+schema+`"`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(`DROP SCHEMA "` + schema + `" CASCADE`) })
	table := fmt.Sprintf("sp_locks_%d", time.Now().UnixNano())
	def := open(t, d.url(t, "", url.Values{"lock_table": {table}}))
	k := testKey(t, "")
	h := mustAcquire(t, ctx, def, k) // creates public's table
	defer h.Release(ctx)
	other := open(t, d.url(t, "", url.Values{"lock_table": {table}, "search_path": {schema + ",public"}}))
	if h2, err := other.TryAcquire(ctx, k); err == nil {
		h2.Release(ctx)
		var n int
		admin.QueryRowContext(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = $2`, schema, table).Scan(&n)
		t.Fatalf("a Locker with search_path=%s,public holds %q while another holds it in public (a table was created in %s: %v)", schema, k, schema, n == 1)
	} else if !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire: %v, want ErrNotAcquired", err)
	}
}

// TestDMLOnlyRole: a role with only SELECT, INSERT, UPDATE and DELETE on
// the two existing tables (PostgreSQL 15 and later grant no CREATE on
// public) takes and releases locks with the default options: the Locker
// does not run CREATE TABLE IF NOT EXISTS on tables that exist, which needs
// CREATE on the schema even then.
func TestDMLOnlyRole(t *testing.T) {
	t.Run("PostgreSQL", func(t *testing.T) {
		d := dialectNamed(t, "PostgreSQL")
		ctx := testCtx(t)
		admin := d.admin(t)
		table := fmt.Sprintf("dml_locks_%d", time.Now().UnixNano())
		owner := open(t, d.url(t, "", url.Values{"lock_table": {table}}))
		k := testKey(t, "")
		mustRelease(t, ctx, mustAcquire(t, ctx, owner, k)) // creates the tables
		role := fmt.Sprintf("dml_%d", time.Now().UnixNano())
		for _, s := range []string{
			`CREATE ROLE "` + role + `" LOGIN PASSWORD 'dml'`,
			`REVOKE CREATE ON SCHEMA public FROM PUBLIC`,
			`GRANT USAGE ON SCHEMA public TO "` + role + `"`,
			`GRANT SELECT, INSERT, UPDATE, DELETE ON "` + table + `", "` + table + `_meta" TO "` + role + `"`,
		} {
			if _, err := admin.ExecContext(ctx, s); err != nil {
				t.Fatalf("%s: %v", s, err)
			}
		}
		t.Cleanup(func() {
			admin.Exec(`REVOKE ALL ON "` + table + `", "` + table + `_meta" FROM "` + role + `"`)
			admin.Exec(`REVOKE ALL ON SCHEMA public FROM "` + role + `"`)
			admin.Exec(`DROP ROLE "` + role + `"`)
		})
		var create bool
		if err := admin.QueryRowContext(ctx, `SELECT has_schema_privilege($1, 'public', 'CREATE')`, role).Scan(&create); err != nil || create {
			t.Fatalf("the role may create in public (%v, %v)", create, err)
		}
		u, err := url.Parse(d.url(t, "", url.Values{"lock_table": {table}}))
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(role, "dml")
		l := open(t, u.String())
		h, err := l.TryAcquire(ctx, k)
		if err != nil {
			t.Fatalf("TryAcquire with a DML-only role: %v", err)
		}
		if _, err := owner.TryAcquire(ctx, k); !errors.Is(err, locker.ErrNotAcquired) {
			t.Errorf("the table's owner: %v, want ErrNotAcquired (one table)", err)
		}
		mustRelease(t, ctx, h)
	})
	t.Run("MariaDB", func(t *testing.T) {
		d := dialectNamed(t, "MariaDB")
		ctx := testCtx(t)
		root := mysqlRoot(t)
		srv := testserver.MySQL(t)
		_, _, dbName := mysqlCreds(t, srv.DSN())
		table := fmt.Sprintf("dml_locks_%d", time.Now().UnixNano())
		owner := open(t, d.url(t, "", url.Values{"lock_table": {table}}))
		k := testKey(t, "")
		mustRelease(t, ctx, mustAcquire(t, ctx, owner, k))
		user := fmt.Sprintf("dml_%d", time.Now().UnixNano()%1e9)
		for _, s := range []string{
			"CREATE USER '" + user + "'@'%' IDENTIFIED BY 'dml'",
			"GRANT SELECT, INSERT, UPDATE, DELETE ON `" + dbName + "`.`" + table + "` TO '" + user + "'@'%'",
			"GRANT SELECT, INSERT, UPDATE, DELETE ON `" + dbName + "`.`" + table + "_meta` TO '" + user + "'@'%'",
		} {
			if _, err := root.ExecContext(ctx, s); err != nil {
				t.Fatalf("%s: %v", s, err)
			}
		}
		t.Cleanup(func() { root.Exec("DROP USER '" + user + "'@'%'") })
		u := url.URL{Scheme: sqltable.SchemeMySQL, User: url.UserPassword(user, "dml"), Host: srv.Addr(), Path: "/" + dbName, RawQuery: url.Values{"lock_table": {table}}.Encode()}
		l := open(t, u.String())
		h, err := l.TryAcquire(ctx, k)
		if err != nil {
			t.Fatalf("TryAcquire with a DML-only user: %v", err)
		}
		if _, err := owner.TryAcquire(ctx, k); !errors.Is(err, locker.ErrNotAcquired) {
			t.Errorf("the table's owner: %v, want ErrNotAcquired (one table)", err)
		}
		mustRelease(t, ctx, h)
	})
}

// mysqlRoot opens the MariaDB server as root (who may grant), or skips.
func mysqlRoot(t *testing.T) *sql.DB {
	t.Helper()
	srv := testserver.MySQL(t)
	for _, pass := range []string{"locker", ""} {
		db := openDB(t, "mysql", fmt.Sprintf("root:%s@tcp(%s)/", pass, srv.Addr()))
		if db.Ping() == nil {
			return db
		}
	}
	t.Skip("no root login on the MariaDB server: cannot make a user with DML rights only")
	return nil
}

// TestBellNameOfQualifiedTable: two MySQL Lockers whose connections are on
// different databases but that name one schema-qualified table ring and
// wait for the same bells (their waiters wake on each other's releases);
// the bell does not depend on the connection's current database.
func TestBellNameOfQualifiedTable(t *testing.T) {
	d := dialectNamed(t, "MariaDB")
	ctx := testCtx(t)
	srv := testserver.MySQL(t)
	_, _, dbName := mysqlCreds(t, srv.DSN())
	admin := d.admin(t)
	other := fmt.Sprintf("bell_other_%d", time.Now().UnixNano())
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+other+"`"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec("DROP DATABASE `" + other + "`") })
	table := dbName + "." + fmt.Sprintf("bell_locks_%d", time.Now().UnixNano())
	a := open(t, d.url(t, "", url.Values{"lock_table": {table}}))
	user, pass, _ := mysqlCreds(t, srv.DSN())
	u := url.URL{Scheme: sqltable.SchemeMySQL, User: url.UserPassword(user, pass), Host: srv.Addr(), Path: "/" + other, RawQuery: url.Values{"lock_table": {table}}.Encode()}
	b := open(t, u.String())
	k := testKey(t, "")
	h := mustAcquire(t, ctx, a, k)
	if _, err := b.TryAcquire(ctx, k); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("the other Locker of the same table: %v, want ErrNotAcquired", err)
	}
	mustRelease(t, ctx, h)
	if na, nb := a.BellName(k), b.BellName(k); na != nb {
		t.Errorf("bells of one key of one table differ: %q (database %s) and %q (database %s)", na, dbName, nb, other)
	}
}

// TestAcquireSlowerThanLease: an acquire statement whose answer comes back
// after its lease ran out on the database hands back no Handle of that
// lease: the Locker gives the row back and tries again within ctx, and the
// Handle it returns holds a lease the database still counts. The answer is
// held (by the fault proxy; on SQLite above the driver) until the row's
// lease has run out by the database's clock.
func TestAcquireSlowerThanLease(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			ctx := testCtx(t)
			admin := d.admin(t)
			var l locker.Locker
			var hold func() (heal func())
			if d.name == "SQLite" {
				// No network to slow down: the answers are held above the
				// driver, once the statement is over.
				db, s := openSlowDB(t, sqliteFile(t)+"?_pragma=busy_timeout(50)&_pragma=synchronous(NORMAL)")
				sl := sqltable.New(db)
				t.Cleanup(func() { sl.Close() })
				l, hold = sl, s.Hold
			} else {
				px := testserver.NewProxy(t, d.addr(t))
				l = open(t, d.url(t, px.Addr(), nil))
				hold = func() func() {
					px.Latency(t, time.Minute)
					return func() { px.Heal(t) }
				}
			}
			mustRelease(t, ctx, mustAcquire(t, ctx, l, testKey(t, "/warm"))) // the table and statements are ready
			k := testKey(t, "")
			const ttl = time.Second
			heal := hold() // healed below, once the lease ran out
			type result struct {
				h   locker.Handle
				err error
			}
			done := make(chan result, 1)
			go func() {
				h, err := l.Acquire(ctx, k, locker.WithTTL(ttl))
				done <- result{h, err}
			}()
			var first string
			for first == "" {
				owner, _, exp, ok := rowOf(t, d, admin, k)
				if ok && owner != "" && exp < dbNowMicros(t, d, admin) {
					first = owner
					break
				}
				select {
				case r := <-done:
					t.Fatalf("Acquire returned before its answer could arrive: %v, %v", r.h, r.err)
				case <-time.After(10 * time.Millisecond):
				}
			}
			heal()
			r := <-done
			if r.err != nil {
				t.Fatalf("Acquire after the slow answer: %v", r.err)
			}
			defer r.h.Release(ctx)
			sh := r.h.(*sqltable.Handle)
			owner, token, exp, ok := rowOf(t, d, admin, k)
			left := time.Duration(exp-dbNowMicros(t, d, admin)) * time.Microsecond
			if err := r.h.Err(); err != nil {
				t.Errorf("the Handle is already ended: %v", err)
			}
			if sh.Owner() == first {
				t.Errorf("Acquire handed back the lease of the slow statement (owner %s), which had run out on the database", first)
			}
			if !ok || owner != sh.Owner() || token != r.h.Token() || left <= 0 {
				t.Errorf("the row is %q token %d, %v left; want the Handle's %q token %d with lease left", owner, token, left, sh.Owner(), r.h.Token())
			}
			if tc, err := l.TryAcquire(ctx, k); err == nil {
				tc.Release(ctx)
				t.Errorf("another TryAcquire took %q while the Handle holds it", k)
			}
		})
	}
}

// TestSQLiteTempTableShadows: a temporary table with the lock table's name
// on a connection of the pool (made by the program, not the Locker) hides
// the main database's table from unqualified statements on that
// connection; the Locker names main's table, so it still shares it with
// other processes.
func TestSQLiteTempTableShadows(t *testing.T) {
	ctx := testCtx(t)
	file := sqliteFile(t)
	db := openDB(t, "sqlite", file+"?_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)")
	db.SetMaxOpenConns(1)
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecContext(ctx, `CREATE TEMP TABLE "`+sqltable.DefaultTable+`" (lock_key TEXT PRIMARY KEY, owner TEXT NOT NULL, token INTEGER NOT NULL, expires_us INTEGER NOT NULL) WITHOUT ROWID`); err != nil {
		t.Fatal(err)
	}
	c.Close() // back to the pool, with its temporary table
	a := sqltable.New(db)
	t.Cleanup(func() { a.Close() })
	b := open(t, sqliteURL(t))
	k := testKey(t, "")
	h := mustAcquire(t, ctx, a, k)
	defer h.Release(ctx)
	if h2, err := b.TryAcquire(ctx, k); err == nil {
		h2.Release(ctx)
		t.Fatalf("two Lockers on one file both hold %q (one of them in a temporary table)", k)
	} else if !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire: %v, want ErrNotAcquired", err)
	}
}
