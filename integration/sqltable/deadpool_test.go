package sqltable_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/sqltable"
)

// TestDeadPooledConnections: every idle connection of the pool dies, and
// the client learns of it only from the request it sends on one (a proxy or
// NAT dropped them as the request left, a failover). database/sql finds a dead connection only when a
// statement uses it, and retries on another only when the driver knew
// before sending; pgx learns of a peer's close by the statement it sent
// (unexpected EOF), so each dead idle connection costs one statement. No
// operation may fail for it while the server is up: the first statement on
// each dead connection is run again on another (the acquire after the
// guarded drop of what it may have taken), until a live one answers.
// (ProxyDropsIdle/PostgreSQL in TestIdleConnectionKillers failed now and
// then on this: a waiter's Acquire returned "unexpected EOF".)
func TestDeadPooledConnections(t *testing.T) {
	const pool = 6
	servers := map[string]func(t *testing.T) (*sql.DB, *testserver.Proxy){
		"PostgreSQL": func(t *testing.T) (*sql.DB, *testserver.Proxy) {
			srv := testserver.Postgres(t)
			px := testserver.NewProxy(t, srv.Addr())
			return openDB(t, "pgx", withQuery(t, srv.DSN(), px.Addr(), nil)), px
		},
		"MariaDB": func(t *testing.T) (*sql.DB, *testserver.Proxy) {
			srv := testserver.MySQL(t)
			px := testserver.NewProxy(t, srv.Addr())
			user, pass, dbName := mysqlCreds(t, srv.DSN())
			return openDB(t, "mysql", user+":"+pass+"@tcp("+px.Addr()+")/"+dbName), px
		},
	}
	for _, name := range []string{"PostgreSQL", "MariaDB"} {
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			db, px := servers[name](t)
			db.SetMaxOpenConns(pool)
			db.SetMaxIdleConns(pool)
			l := sqltable.New(db)
			t.Cleanup(func() { l.Close() })
			other := sqltable.New(dialectNamed(t, name).admin(t))
			t.Cleanup(func() { other.Close() })
			mustRelease(t, ctx, mustAcquire(t, ctx, l, testKey(t, "/warm")))
			// fill fills the pool with idle connections, then the proxy
			// resets them all.
			fill := func(t *testing.T) {
				t.Helper()
				// Connections left dead by the step before are found
				// dead by the ping and dropped from the pool.
				// The Locker may keep connections of its own (the
				// MariaDB bell of a held key): fill the rest. Twice:
				// pgx pings a connection when it is taken from the pool
				// if it was not used for a second (a new one: always),
				// which would find it dead before the statement; in
				// production a pool's connections are mostly in use.
				want := pool - db.Stats().InUse
				for round := 0; round < 2; round++ {
					var conns []*sql.Conn
					for tries := 0; len(conns) < want; tries++ {
						// The Locker may have taken connections
						// meanwhile (a bell, a background drop): a pool
						// that has none left within a second is full
						// enough.
						cctx, cancel := context.WithTimeout(ctx, time.Second)
						c, err := db.Conn(cctx)
						cancel()
						if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
							break
						}
						if err != nil {
							t.Fatalf("fill the pool: %v", err)
						}
						if err := c.PingContext(ctx); err != nil {
							c.Close()
							if tries > 4*pool {
								t.Fatalf("fill the pool: %v", err)
							}
							continue
						}
						conns = append(conns, c)
					}
					for _, c := range conns {
						c.Close()
					}
				}
				// (The Locker's background work may have taken one
				// meanwhile.)
				if db.Stats().Idle == 0 {
					t.Fatal("no idle connection in the pool")
				}
				px.DropOnNextRequest(t)
			}
			var h locker.Handle
			steps := []struct {
				name string
				f    func() error
			}{
				{"TryAcquire", func() (err error) {
					h, err = l.TryAcquire(ctx, testKey(t, "/try"))
					return err
				}},
				{"Release", func() error { return h.Release(ctx) }},
				{"Acquire", func() (err error) {
					h, err = l.Acquire(ctx, testKey(t, "/acquire"))
					return err
				}},
				{"Inspect", func() error {
					_, err := l.Inspect(ctx, h.Key())
					return err
				}},
				{"Release", func() error { return h.Release(ctx) }},
				{"TryAcquire of a held key", func() error {
					k := testKey(t, "/held")
					oh := mustAcquire(t, ctx, other, k)
					defer mustRelease(t, ctx, oh)
					_, err := l.TryAcquire(ctx, k)
					if errors.Is(err, locker.ErrNotAcquired) {
						return nil
					}
					return errors.Join(errors.New("want ErrNotAcquired"), err)
				}},
				{"TryAcquireSemaphore", func() (err error) {
					h, err = l.TryAcquireSemaphore(ctx, testKey(t, "/sem"), 2)
					return err
				}},
				{"Release of a permit", func() error { return h.Release(ctx) }},
				{"TryAcquireWrite", func() (err error) {
					h, err = l.TryAcquireWrite(ctx, testKey(t, "/rw"))
					return err
				}},
				{"Release of a write lock", func() error { return h.Release(ctx) }},
			}
			for _, s := range steps {
				fill(t)
				before := db.Stats()
				if err := s.f(); err != nil {
					t.Fatalf("%s after every pooled connection died: %v\n(pool before: %d open, %d in use, %d idle; after: %+v)", s.name, err, before.OpenConnections, before.InUse, before.Idle, db.Stats())
				}
			}
		})
	}
}
