package sqltable_test

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/sqltable"
)

// TestIdleConnectionKillers: the server ends connections idle for longer
// than a setting given per session in the DSN (no restart): PostgreSQL's
// idle_session_timeout (and idle_in_transaction_session_timeout, which the
// lock statements, single-statement transactions, never meet) and MySQL's
// wait_timeout. The pool's connections, the PostgreSQL listener's and the
// MySQL bell's die between renewals (TTL 2s, renewals every 667ms; the
// timeouts are 250ms on PostgreSQL and 1s, the least MySQL takes, on
// MariaDB); "ProxyDropsIdle": a proxy drops them instead. The holder must
// keep its lock or report its loss before another client holds the key;
// then its Release must succeed or say why.
func TestIdleConnectionKillers(t *testing.T) {
	t.Run("PostgreSQL", func(t *testing.T) {
		requireSQLPG(t, 140000)
		dsn := withQuery(t, testserver.Postgres(t).DSN(), "", url.Values{
			"idle_session_timeout":                {"250ms"},
			"idle_in_transaction_session_timeout": {"250ms"},
		})
		db := openDB(t, "pgx", dsn)
		requireSetting(t, db, "SHOW idle_session_timeout", "250ms")
		admin := dialectNamed(t, "PostgreSQL").admin(t)
		idleKiller(t, db, admin, func(t *testing.T, l *sqltable.Locker, k string) {
			// The listener's session, idle by design, was not ended
			// again and again: one has lived for the whole hold.
			var n int
			q := "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE '%set_config(''idle_session_timeout'', ''0''%' AND backend_start < now() - interval '4 seconds'"
			if err := admin.QueryRowContext(testCtx(t), q).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				t.Error("no listening session has lived through the hold: idle_session_timeout keeps ending the listener")
			}
		})
	})
	t.Run("MariaDB", func(t *testing.T) {
		dsn := testserver.MySQL(t).DSN()
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		db := openDB(t, "mysql", dsn+sep+"wait_timeout=1")
		requireSetting(t, db, "SELECT @@SESSION.wait_timeout", "1")
		admin := dialectNamed(t, "MariaDB").admin(t)
		idleKiller(t, db, admin, func(t *testing.T, l *sqltable.Locker, k string) {
			// The bell of the held key is still rung: wait_timeout did
			// not end the bell connection under it.
			var id sql.NullInt64
			if err := admin.QueryRowContext(testCtx(t), "SELECT IS_USED_LOCK(?)", l.BellName(k)).Scan(&id); err != nil {
				t.Fatal(err)
			}
			if !id.Valid {
				t.Error("the held key's bell is free after the hold: wait_timeout ended the bell connection")
			}
		})
	})
	// A proxy that drops connections on which the client sent nothing for
	// 500ms (a load balancer's or NAT's idle timeout): less than the 667ms
	// between renewals, so idle pool connections die between them, and
	// more than a loaded machine may take to answer a new connection's
	// handshake (at 250ms, a waiter's connection was dropped while the
	// server, under a load of 20, was still starting its session).
	t.Run("ProxyDropsIdle", func(t *testing.T) {
		t.Run("PostgreSQL", func(t *testing.T) {
			srv := testserver.Postgres(t)
			px := testserver.NewProxy(t, srv.Addr())
			px.DropIdle(t, 500*time.Millisecond)
			idleKiller(t, openDB(t, "pgx", withQuery(t, srv.DSN(), px.Addr(), nil)), dialectNamed(t, "PostgreSQL").admin(t), nil)
		})
		t.Run("MariaDB", func(t *testing.T) {
			srv := testserver.MySQL(t)
			px := testserver.NewProxy(t, srv.Addr())
			px.DropIdle(t, 500*time.Millisecond)
			user, pass, dbName := mysqlCreds(t, srv.DSN())
			idleKiller(t, openDB(t, "mysql", user+":"+pass+"@tcp("+px.Addr()+")/"+dbName), dialectNamed(t, "MariaDB").admin(t), nil)
		})
	})
}

// idleKiller holds a key on a Locker of db for about seven renewals while
// a waiter of the same Locker (which starts its listener) and one of a
// Locker on other wait for it, and decides by the order of events: a
// waiter that gets the key must find the holder's handle already Done
// with ErrLost; a holder still held at the end releases without error and
// a waiter then gets the key. held, if not nil, checks more at the end of
// the hold while the key is still held.
func idleKiller(t *testing.T, db, other *sql.DB, held func(t *testing.T, l *sqltable.Locker, k string)) {
	t.Helper()
	ctx := testCtx(t)
	l1 := sqltable.New(db, sqltable.WithDefaultTTL(2*time.Second))
	t.Cleanup(func() { l1.Close() })
	l2 := sqltable.New(other, sqltable.WithDefaultTTL(2*time.Second))
	t.Cleanup(func() { l2.Close() })
	k := testKey(t, "")
	h1 := mustAcquire(t, ctx, l1, k)
	type grant struct {
		who    string
		h      locker.Handle
		err    error
		h1Err  error
		h1Done bool
	}
	got := make(chan grant, 2)
	wait := func(who string, l *sqltable.Locker) {
		h, err := l.Acquire(ctx, k)
		g := grant{who: who, h: h, err: err, h1Err: h1.Err()}
		select {
		case <-h1.Done():
			g.h1Done = true
		default:
		}
		if err == nil {
			// Hold a moment, so that the other waiter's grant cannot
			// overlap h1 unseen, then let it have the key.
			time.Sleep(10 * time.Millisecond)
			_ = h.Release(context.Background())
		}
		got <- g
	}
	go wait("a waiter of the holder's Locker", l1)
	go wait("a waiter of another Locker", l2)
	check := func(g grant) {
		t.Helper()
		if g.err != nil {
			t.Fatalf("%s: Acquire: %v", g.who, g.err)
		}
		if !g.h1Done || !errors.Is(g.h1Err, locker.ErrLost) {
			t.Fatalf("second holder: %s got the key (token %d) while the holder's handle had Err() = %v, Done closed %v", g.who, g.h.Token(), g.h1Err, g.h1Done)
		}
	}
	select {
	case g := <-got:
		check(g)
		t.Logf("the holder lost its lock (reported first): %v", g.h1Err)
		check(<-got)
		return
	case <-time.After(5 * time.Second):
	}
	if err := h1.Err(); err != nil {
		t.Logf("the holder lost its lock (reported): %v", err)
	} else {
		t.Logf("the holder kept its lock for 5s")
		if held != nil {
			held(t, l1, k)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		// A statement on a pooled connection that died while idle (pgx
		// learns of the close only by using it) fails; the release then
		// runs once more on another connection, and must succeed.
		if err := h1.Release(rctx); err != nil {
			t.Fatalf("Release: %v (Err: %v)", err, h1.Err())
		}
	}
	for range 2 {
		select {
		case g := <-got:
			if g.err != nil {
				t.Fatalf("%s: Acquire: %v", g.who, g.err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a waiter did not get the key within 30s of the release")
		}
	}
}

func requireSQLPG(t *testing.T, version int) {
	t.Helper()
	var v int
	if err := dialectNamed(t, "PostgreSQL").admin(t).QueryRowContext(testCtx(t), "SELECT current_setting('server_version_num')::int").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v < version {
		t.Skipf("server version %d has no idle_session_timeout", v)
	}
}

// requireSetting checks that the DSN's setting is in effect on db's
// connections: else the test would test nothing.
func requireSetting(t *testing.T, db *sql.DB, q, want string) {
	t.Helper()
	var v string
	if err := db.QueryRowContext(testCtx(t), q).Scan(&v); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	if v != want {
		t.Fatalf("%s = %q, want %q: the DSN's setting is not in effect", q, v, want)
	}
}
