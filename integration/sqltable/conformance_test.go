package sqltable_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/sqltable"
)

// suiteTTL is the lease the suite asks for; renewals run every TTL/3.
const suiteTTL = 2 * time.Second

// steal expires key's row from another connection, as an operator taking a
// lock away would: the next acquirer takes the key at once, and the robbed
// holder's next renewal finds its lease over.
func steal(t *testing.T, d dialect, admin *sql.DB, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := admin.ExecContext(ctx, "UPDATE "+d.table("")+" SET expires_us = 0 WHERE lock_key = "+d.ph(1), key)
	if err != nil {
		t.Fatalf("Steal: %v", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("Steal: %d rows updated, want 1", n)
	}
}

func TestConformance(t *testing.T) {
	t.Run("SQLite", func(t *testing.T) {
		d := dialects[0]
		file := sqliteFile(t)
		admin := d.admin(t)
		var faults testserver.Registry[*faultDB]
		conformance.Run(t, conformance.Harness{
			IgnoreGoroutines: testserver.ProxyGoroutines,
			NewLocker: func(t *testing.T) locker.Locker {
				// Another process, as far as the lock table can tell: a
				// pool of its own on the same file.
				db, f := openFaultDB(t, file+"?_pragma=busy_timeout(50)&_pragma=synchronous(NORMAL)")
				db.SetMaxOpenConns(4)
				l := sqltable.New(db, sqltable.WithDialect(sqltable.SQLite))
				faults.Put(l, f)
				t.Cleanup(func() { l.Close() })
				return l
			},
			// Crash: every later statement of the client fails at once; its
			// rows stay until their lease runs out.
			Crash: func(t *testing.T, l locker.Locker) { faults.Get(t, l, "Crash").Crash() },
			// Cut: every statement of the client hangs until heal.
			Cut:            func(t *testing.T, l locker.Locker) func() { return faults.Get(t, l, "Cut").Cut() },
			Steal:          func(t *testing.T, h locker.Handle) { steal(t, d, admin, h.Key()) },
			LossBound:      suiteTTL/3 + time.Second,
			URL:            sqliteURL(t),
			TTL:            suiteTTL,
			NoInspectLease: "the lock table keeps the expiry, not the lease",
			// Waiters in other processes are woken through the signal
			// file; a lost signal costs at most the retry interval (1s
			// by default).
			HandoffBound: 1500 * time.Millisecond,
			ManyKeys:     500,
			Unsafe:       sqliteUnsafe(file),
		})
	})
	for _, d := range dialects[1:] {
		t.Run(d.name, func(t *testing.T) { runServerConformance(t, d) })
	}
}

// runServerConformance runs the suite on d, a database server: Lockers
// connect with d.url through a proxy each, Steal uses d.admin.
func runServerConformance(t *testing.T, d dialect) {
	addr := d.addr(t)
	admin := d.admin(t)
	var proxies testserver.Registry[*testserver.Proxy]
	h := conformance.Harness{
		IgnoreGoroutines: testserver.ProxyGoroutines,
		NewLocker: func(t *testing.T) locker.Locker {
			px := testserver.NewProxy(t, addr)
			l := open(t, d.url(t, px.Addr(), url.Values{"lock_max_conns": {"20"}}))
			proxies.Put(l, px)
			if d.warmUp {
				warmUp(t, l)
			}
			return l
		},
		// Crash closes every connection of the client and refuses
		// new ones: its rows stay until their lease runs out.
		Crash: func(t *testing.T, l locker.Locker) { proxies.Get(t, l, "Crash").Crash(t) },
		// Every connection of the client closed from outside.
		Reset: func(t *testing.T, l locker.Locker) { proxies.Get(t, l, "Reset").ResetAll(t) },
		Cut: func(t *testing.T, l locker.Locker) func() {
			px := proxies.Get(t, l, "Cut")
			px.Partition(t)
			return func() { px.Heal(t) }
		},
		Steal:          func(t *testing.T, h locker.Handle) { steal(t, d, admin, h.Key()) },
		LossBound:      suiteTTL/3 + time.Second,
		URL:            d.url(t, "", nil),
		TTL:            suiteTTL,
		NoInspectLease: "the lock table keeps the expiry, not the lease",
		HandoffBound:   time.Second,
		ManyKeys:       500,
		Only:           d.only,
	}
	if d.name == "PostgreSQL" {
		// MySQL and MariaDB have no temporary schema to refuse
		// (see "Unsafe configurations" in the package
		// documentation).
		h.Unsafe = pgUnsafe(t, d, admin, &proxies)
	}
	conformance.Run(t, h)
}

// warmUp takes and releases a key of its own on a new Locker, which leaves
// a connection in its pool and its tables checked. Over TLS a first
// connection's handshake, under -race on a loaded machine, took more than
// the 200ms in which the cases take a waiter for queued (stillWaiting): a
// writer still connecting was taken for one in the queue, and a reader
// that came later "overtook" it (RW/WriterNotStarved failed so, on
// PostgreSQL over TLS).
func warmUp(t *testing.T, l locker.Locker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := l.TryAcquire(ctx, fmt.Sprintf("warm-up/%d", time.Now().UnixNano()))
	if err != nil {
		t.Fatalf("warm-up TryAcquire of a new Locker: %v", err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatalf("warm-up Release of a new Locker: %v", err)
	}
}

// sqliteUnsafe are the SQLite configurations a Locker refuses: a table in
// the temporary schema (each connection has its own) and an in-memory
// database.
func sqliteUnsafe(file string) []conformance.UnsafeConfig {
	openURL := func(raw string) func(t *testing.T) (locker.Locker, error) {
		return func(t *testing.T) (locker.Locker, error) {
			l, err := sqltable.Open(context.Background(), raw)
			if err != nil {
				return nil, err
			}
			return l, nil
		}
	}
	newDB := func(dsn string, opts ...sqltable.Option) func(t *testing.T) (locker.Locker, error) {
		return func(t *testing.T) (locker.Locker, error) {
			db := openDB(t, "sqlite", dsn)
			l := sqltable.New(db, opts...)
			return l, l.Err()
		}
	}
	return []conformance.UnsafeConfig{
		{Name: "lock_table=temp.locks", New: openURL("sqlite://" + file + "?lock_table=temp.locks"), Mention: "lock_table"},
		{Name: "WithTable(TEMP.locks)", New: newDB(file, sqltable.WithTable("TEMP.locks")), Mention: "WithTable"},
		{Name: "sqlite::memory:", New: openURL("sqlite::memory:"), Mention: "in-memory"},
		{Name: "New(db of :memory:)", New: newDB(":memory:"), Mention: "in-memory"},
	}
}

// pgUnsafe are the PostgreSQL configurations a Locker refuses, or makes
// safe: a table in pg_temp (by name, or by a search_path that puts pg_temp
// first where the table does not exist) is refused; a search_path with
// pg_temp first where public has the table uses public's table.
func pgUnsafe(t *testing.T, d dialect, admin *sql.DB, proxies *testserver.Registry[*testserver.Proxy]) []conformance.UnsafeConfig {
	openURL := func(extra url.Values) func(t *testing.T) (locker.Locker, error) {
		return func(t *testing.T) (locker.Locker, error) {
			l, err := sqltable.Open(context.Background(), d.url(t, "", extra))
			if err != nil {
				return nil, err
			}
			return l, nil
		}
	}
	fresh := fmt.Sprintf("tmp_first_%d", time.Now().UnixNano())
	return []conformance.UnsafeConfig{
		{Name: "lock_table=pg_temp.locks", New: openURL(url.Values{"lock_table": {"pg_temp.locks"}}), Mention: "lock_table"},
		{Name: "lock_table=PG_TEMP_3.locks", New: openURL(url.Values{"lock_table": {"PG_TEMP_3.locks"}}), Mention: "lock_table"},
		{Name: "WithTable(pg_temp.locks)", Mention: "WithTable", New: func(t *testing.T) (locker.Locker, error) {
			l := sqltable.New(openDB(t, "pgx", testserver.Postgres(t).DSN()), sqltable.WithTable("pg_temp.locks"))
			return l, l.Err()
		}},
		{Name: "search_path=pg_temp,public/new-table", New: openURL(url.Values{"search_path": {"pg_temp,public"}, "lock_table": {fresh}}), Mention: "search_path"},
		{Name: "search_path=pg_temp,public/existing-table", MadeSafe: true, New: func(t *testing.T) (locker.Locker, error) {
			ddl, err := sqltable.DDL(sqltable.PostgreSQL, "public."+sqltable.DefaultTable)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range ddl {
				if _, err := admin.Exec(s); err != nil && !strings.Contains(err.Error(), "already exists") {
					t.Fatalf("%s: %v", s, err)
				}
			}
			px := testserver.NewProxy(t, d.addr(t))
			l, err := sqltable.Open(context.Background(), d.url(t, px.Addr(), url.Values{"search_path": {"pg_temp,public"}}))
			if err != nil {
				return nil, err
			}
			proxies.Put(l, px)
			return l, nil
		}},
	}
}
