package sqltable_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/sqltable"
)

// TestRenewalsPastAFullPool: acquisitions that wait on the server (each
// key's row locked by another transaction, as an operator's SELECT ... FOR
// UPDATE or a client gone silent inside a transaction would keep it), as
// many as the Locker's pool has connections. The Locker's held locks must
// still renew: a stuck key costs its own waiters their time, not the
// Locker's other locks. (On 4263d61 the acquisitions took every
// connection, and the held locks were lost within a TTL, on PostgreSQL
// and MariaDB.)
func TestRenewalsPastAFullPool(t *testing.T) {
	for _, d := range dialects[1:] { // SQLite locks the whole database, not a row
		t.Run(d.name, func(t *testing.T) {
			const conns = 4
			db := d.admin(t)
			db.SetMaxOpenConns(conns)
			l := sqltable.New(db)
			t.Cleanup(func() { l.Close() })
			admin := d.admin(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			const ttl = 1500 * time.Millisecond
			hs := testserver.TakeKeys(t, l, "fullpool", 3, ttl)

			// conns keys, each taken once (its row exists) and locked by
			// the admin transaction.
			stuck := make([]string, conns)
			for i := range stuck {
				stuck[i] = testKey(t, fmt.Sprintf("-stuck%d", i))
				mustRelease(t, ctx, mustAcquire(t, ctx, l, stuck[i]))
			}
			tx, err := admin.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			for _, k := range stuck {
				var got string
				if err := tx.QueryRowContext(ctx, fmt.Sprintf("SELECT lock_key FROM %s WHERE lock_key = %s FOR UPDATE", d.table(""), d.ph(1)), k).Scan(&got); err != nil {
					t.Fatal(err)
				}
			}
			// An Acquire per stuck key: each waits on its row.
			actx, acancel := context.WithTimeout(ctx, 10*ttl)
			defer acancel()
			done := make(chan error, conns)
			for _, k := range stuck {
				go func() {
					h, err := l.Acquire(actx, k)
					if err == nil {
						err = h.Release(ctx)
					}
					done <- err
				}()
			}
			awaitPoolFull(t, ctx, db, done)
			testserver.StayHeld(t, hs, nil, 3*ttl, "the pool's every connection was held by an acquisition waiting on a locked row")
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			for range stuck {
				if err := <-done; err != nil {
					t.Errorf("an acquisition of a key whose row was locked, after the lock went: %v", err)
				}
			}
		})
	}
}

// awaitPoolFull waits until all connections of db's pool but one at most
// are in use: held by the acquisitions of the stuck keys (on MySQL also by
// the bell of the held locks). Before the acquisitions had a share of the
// pool the last one took the last connection as well.
func awaitPoolFull(t *testing.T, ctx context.Context, db *sql.DB, done chan error) {
	t.Helper()
	for {
		s := db.Stats()
		if s.InUse >= s.MaxOpenConnections-1 {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("an acquisition of a key whose row is locked ended: %v", err)
		case <-ctx.Done():
			t.Fatalf("the pool never filled (%+v): %v", s, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}
