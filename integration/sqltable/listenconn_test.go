package sqltable_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/sqltable"
)

// database/sql's Result.RowsAffected takes the lock of the connection the
// statement ran on, which went back to the pool when the statement ended;
// Conn.Raw holds that lock while its function runs. The Locker's LISTEN
// session waits for hours: had it waited inside Raw on a pooled connection,
// a RowsAffected of that connection's previous user would wait as long (the
// chaos test caught a drop in an Acquire doing so after a server restart).
// Here the previous user is the test: a statement, then a waiting Acquire
// whose listener takes a connection (the pool hands out the one freed
// last); the count must come at once.
func TestListenerLeavesPooledConnections(t *testing.T) {
	ctx := testCtx(t)
	db := openDB(t, "pgx", testserver.Postgres(t).DSN())
	db.SetMaxOpenConns(8)
	l := sqltable.New(db, sqltable.WithDefaultTTL(10*time.Second))
	t.Cleanup(func() { _ = l.Close() })
	k := testKey(t, "")
	h := mustAcquire(t, ctx, l, k)
	defer mustRelease(t, ctx, h)

	admin := dialectNamed(t, "PostgreSQL").admin(t)
	var t0 time.Time
	if err := admin.QueryRowContext(ctx, "SELECT now()").Scan(&t0); err != nil {
		t.Fatal(err)
	}
	res, err := db.ExecContext(ctx, "SELECT 1")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waited := make(chan error, 1)
	go func() {
		_, err := l.Acquire(wctx, k)
		waited <- err
	}()
	// The waiter's listener is up once a session that began after t0 has
	// the listener's set-up for its last statement.
	for {
		var n int
		if err := admin.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND backend_start >= $1 AND query LIKE '%set_config(''idle_session_timeout'', ''0''%'`, t0).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the waiter's listener never started")
		case <-time.After(10 * time.Millisecond):
		}
	}
	got := make(chan error, 1)
	go func() {
		_, err := res.RowsAffected()
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("RowsAffected: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("RowsAffected of a statement run before the Locker began listening has not returned in 5s: the listener holds its connection")
	}
	cancel()
	<-waited
}
