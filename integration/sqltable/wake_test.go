package sqltable_test

import (
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/sqltable"
)

// TestWakeAcrossIdentities: two Lockers of one process on the same
// PostgreSQL table whose database identity differs (the wake-up hub keys
// its waiters by it) hand a key back and forth. A release wakes the other
// Locker's waiter through its listener (NOTIFY), as a release in another
// process would; the release's in-process wake, which reaches no waiter of
// the other identity, must not mark the release heard so that the NOTIFY
// is dropped as a duplicate. The retry interval is 3s, so that a lost
// wake-up shows; a handoff over 750ms counts as lost, and more than 1 of 20
// fails the test.
//
// The identities differ by the schema unqualified names resolve to
// (search_path; the table is schema-qualified, so both use one table) and,
// where the server answers there, by the loopback address the Locker
// connects to (127.0.0.1 and 127.0.0.2).
func TestWakeAcrossIdentities(t *testing.T) {
	srv := testserver.Postgres(t)
	admin := dialectNamed(t, "PostgreSQL").admin(t)
	ctx := testCtx(t)
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA IF NOT EXISTS locker_other"); err != nil {
		t.Fatal(err)
	}
	table := "public." + sqltable.DefaultTable
	opts := []sqltable.Option{sqltable.WithTable(table), sqltable.WithDefaultTTL(30 * time.Second), sqltable.WithRetryInterval(3 * time.Second)}
	t.Run("SearchPath", func(t *testing.T) {
		a := sqltable.New(openDB(t, "pgx", srv.DSN()), opts...)
		b := sqltable.New(openDB(t, "pgx", withQuery(t, srv.DSN(), "", url.Values{"search_path": {"locker_other"}})), opts...)
		handoffs(t, a, b, 20, 750*time.Millisecond)
	})
	t.Run("HostAlias", func(t *testing.T) {
		_, port, _ := net.SplitHostPort(srv.Addr())
		alias := net.JoinHostPort("127.0.0.2", port)
		if c, err := net.DialTimeout("tcp", alias, time.Second); err != nil {
			t.Skipf("the server does not answer on %s: %v", alias, err)
		} else {
			c.Close()
		}
		a := sqltable.New(openDB(t, "pgx", srv.DSN()), opts...)
		b := sqltable.New(openDB(t, "pgx", withQuery(t, srv.DSN(), alias, nil)), opts...)
		handoffs(t, a, b, 20, 750*time.Millisecond)
	})
}

// withQuery returns dsn (a URL) through addr, when not empty, with extra
// parameters.
func withQuery(t testing.TB, dsn, addr string, extra url.Values) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
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

// handoffs passes one key n times between a and b: each round one Locker
// holds it while the other waits, then releases; the time from the
// release to the waiter's grant is counted over bound or not. More than
// one of n over bound fails.
func handoffs(t *testing.T, a, b *sqltable.Locker, n int, bound time.Duration) {
	t.Helper()
	t.Cleanup(func() { a.Close(); b.Close() })
	ctx := testCtx(t)
	key := testKey(t, "")
	ls := []*sqltable.Locker{a, b}
	var over []time.Duration
	for i := range n {
		holder, waiter := ls[i%2], ls[(i+1)%2]
		h := mustAcquire(t, ctx, holder, key)
		type grant struct {
			at  time.Time
			err error
		}
		got := make(chan grant, 1)
		go func() {
			h2, err := waiter.Acquire(ctx, key)
			g := grant{time.Now(), err}
			if err == nil {
				err = h2.Release(ctx)
			}
			if g.err == nil {
				g.err = err
			}
			got <- g
		}()
		// Nothing says the waiter waits: give it time to try, register
		// and sleep (a waiter that is late only tries once more).
		time.Sleep(150 * time.Millisecond)
		select {
		case g := <-got:
			t.Fatalf("round %d: the waiter returned while the key was held: %v", i, g.err)
		default:
		}
		start := time.Now()
		mustRelease(t, ctx, h)
		g := <-got
		if g.err != nil {
			t.Fatalf("round %d: waiter: %v", i, g.err)
		}
		if d := g.at.Sub(start); d > bound {
			over = append(over, d)
		}
	}
	t.Logf("%d of %d handoffs over %v: %v", len(over), n, bound, over)
	if len(over) > 1 {
		t.Errorf("%d of %d handoffs took longer than %v (%v): a release's wake-up was lost", len(over), n, bound, over)
	}
}
