package sqltable_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/go-locker/locker/sqltable"
)

// TestPoolShrunkAfterNew: the pool's limit is read when a connection is
// taken for the PostgreSQL listener or the MySQL bell, not once at New. A
// *sql.DB whose limit drops to one connection after New must still serve a
// lone holder's renewals and its Release: neither the listener nor the bell
// may pin the only connection. "BeforeUse": the limit drops before the
// first lock, then a waiter (which starts the listener) and a holder that
// holds past its bell delay. "WhileListening": the listener and the bell
// connection are up (a handoff on a pool without a limit), then the limit
// drops to one while they hold their connections; "OtherLockerListening":
// the same, and the holder is another Locker on the same *sql.DB.
func TestPoolShrunkAfterNew(t *testing.T) {
	for _, d := range dialects[1:] {
		t.Run(d.name, func(t *testing.T) {
			t.Run("BeforeUse", func(t *testing.T) {
				db := d.admin(t)
				l := sqltable.New(db, sqltable.WithDefaultTTL(time.Second))
				t.Cleanup(func() { l.Close() })
				db.SetMaxOpenConns(1)
				holdThrough(t, l, testKey(t, ""))
			})
			for _, other := range []bool{false, true} {
				name := "WhileListening"
				if other {
					name = "OtherLockerListening"
				}
				t.Run(name, func(t *testing.T) {
					ctx := testCtx(t)
					db := d.admin(t)
					l := sqltable.New(db, sqltable.WithDefaultTTL(time.Second))
					t.Cleanup(func() { l.Close() })
					// A handoff between two goroutines: the waiter starts
					// the listener (PostgreSQL), the holder rings its bell
					// (MariaDB) after holding 5ms.
					k := testKey(t, "-warm")
					h := mustAcquire(t, ctx, l, k)
					got := make(chan error, 1)
					go func() {
						h2, err := l.Acquire(ctx, k)
						if err == nil {
							err = h2.Release(ctx)
						}
						got <- err
					}()
					time.Sleep(200 * time.Millisecond) // the waiter waits, the bell rings
					mustRelease(t, ctx, h)
					if err := <-got; err != nil {
						t.Fatal(err)
					}
					if d.name == "PostgreSQL" {
						// The listener, on a connection of its own.
						awaitListener(t, ctx, db)
					} else if n := db.Stats().InUse; n == 0 {
						// The bell connection keeps one.
						t.Fatal("no connection pinned after the warm-up: the bell is not up, and the test would test nothing")
					}
					db.SetMaxOpenConns(1)
					if other {
						// Another Locker on the same *sql.DB, whose
						// statements must get the connection l pins.
						l2 := sqltable.New(db, sqltable.WithDefaultTTL(time.Second))
						t.Cleanup(func() { l2.Close() })
						l = l2
					}
					holdThrough(t, l, testKey(t, ""))
				})
			}
		})
	}
}

// holdThrough takes key on l, starts a waiter of key on l, holds for about
// ten renewals, and checks that the holder kept its lock, that the waiter
// did not get it meanwhile, that Release succeeds and that the waiter then
// gets the key.
func holdThrough(t *testing.T, l *sqltable.Locker, key string) {
	t.Helper()
	ctx := testCtx(t)
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	h, err := l.Acquire(actx, key)
	cancel()
	if err != nil {
		t.Fatalf("Acquire on a pool shrunk to one connection: %v", err)
	}
	got := make(chan error, 1)
	go func() {
		h2, err := l.Acquire(ctx, key)
		if err == nil {
			err = h2.Release(ctx)
		}
		got <- err
	}()
	select {
	case <-h.Done():
		t.Fatalf("holder lost its lock on a pool shrunk to one connection: %v", h.Err())
	case err := <-got:
		t.Fatalf("waiter returned while the lock was held: %v", err)
	case <-time.After(3500 * time.Millisecond): // about ten renewals
	}
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	if err := h.Release(rctx); err != nil {
		t.Fatalf("Release on a pool shrunk to one connection: %v (Err: %v)", err, h.Err())
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter after the release: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter did not get the lock within 10s of the release")
	}
}

// awaitListener waits (up to 5s) until the server shows a listening
// session of a Locker on db's database: one whose last statement was the
// listener's setup (it turns idle_session_timeout off after LISTEN), idle
// since.
func awaitListener(t *testing.T, ctx context.Context, db *sql.DB) {
	t.Helper()
	const q = `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle' AND query LIKE '%set_config(''idle_session_timeout'', ''0''%'`
	for deadline := time.Now().Add(5 * time.Second); ; {
		var n int
		if err := db.QueryRowContext(ctx, q).Scan(&n); err != nil {
			t.Fatalf("looking for the listener: %v", err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no listening session after the warm-up: the listener is not up, and the test would test nothing")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
