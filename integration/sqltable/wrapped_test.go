package sqltable_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/sqltable"
)

// wrappedConnector hands out pgx's connections behind a wrapper, as
// instrumentation libraries (otelsql, sqlhooks) do: the Locker cannot reach
// pgx below it, so it must acquire through database/sql and wait without
// LISTEN.
type wrappedConnector struct{ inner driver.Connector }

func (c wrappedConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return wrappedConn{conn}, nil
}

func (c wrappedConnector) Driver() driver.Driver { return wrappedDriver{} }

type wrappedDriver struct{}

func (wrappedDriver) Open(string) (driver.Conn, error) {
	return nil, errors.New("wrappedDriver: use the connector")
}

// wrappedConn passes the context-aware calls through, as such wrappers do.
type wrappedConn struct{ driver.Conn }

func (c wrappedConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (c wrappedConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (c wrappedConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
}

func (c wrappedConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

// A *sql.DB whose driver wraps pgx's works on PostgreSQL when the dialect
// is given: exclusion, a waiter woken by the release, rising tokens.
func TestWrappedPostgresDriver(t *testing.T) {
	cfg, err := pgx.ParseConfig(testserver.Postgres(t).DSN())
	if err != nil {
		t.Fatal(err)
	}
	open := func() *sqltable.Locker {
		db := sql.OpenDB(wrappedConnector{stdlib.GetConnector(*cfg)})
		t.Cleanup(func() { db.Close() })
		l := sqltable.New(db, sqltable.WithDialect(sqltable.PostgreSQL))
		t.Cleanup(func() { l.Close() })
		return l
	}
	a, b := open(), open()
	ctx := testCtx(t)
	k := testKey(t, "")
	h := mustAcquire(t, ctx, a, k)
	if _, err := b.TryAcquire(ctx, k); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key: %v, want ErrNotAcquired", err)
	}
	got := make(chan locker.Handle, 1)
	go func() {
		h2, err := b.Acquire(ctx, k)
		if err != nil {
			t.Errorf("waiting Acquire: %v", err)
		}
		got <- h2
	}()
	mustRelease(t, ctx, h)
	select {
	case h2 := <-got:
		if h2 == nil {
			t.FailNow()
		}
		if h2.Token() <= h.Token() {
			t.Errorf("token %d after %d", h2.Token(), h.Token())
		}
		mustRelease(t, ctx, h2)
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter was not woken within 20s of the release")
	}
}
