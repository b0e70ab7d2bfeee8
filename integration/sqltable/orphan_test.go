package sqltable_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"
)

// upsertWaiting reports whether the server shows an acquire statement on
// the default table (its name qualified with the schema) waiting (for a
// row lock) in another session.
func upsertWaiting(t *testing.T, d dialect, admin *sql.DB) bool {
	t.Helper()
	var q string
	switch d.name {
	case "PostgreSQL":
		q = `SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND datname = current_database()
AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO %"locker_locks" %'`
	default:
		q = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() AND INFO LIKE 'INSERT INTO %`locker_locks` %'"
	}
	var n int
	if err := admin.QueryRow(q).Scan(&n); err != nil {
		t.Fatalf("look for the waiting upsert: %v", err)
	}
	return n > 0
}

// TestCancelledAcquireLeavesNoRow: an Acquire cancelled while its upsert
// waits on the server (here for a lock another transaction holds) may see
// the upsert commit after it gave up, and after its first clean-up drop ran
// (which found no row of its own). The clean-up repeats the drop, so the
// key is free again long before the 30s lease of the orphaned row would run
// out.
func TestCancelledAcquireLeavesNoRow(t *testing.T) {
	for _, d := range dialects[1:] {
		t.Run(d.name, func(t *testing.T) {
			ctx := testCtx(t)
			l := open(t, d.url(t, "", nil)) // default TTL, 30s
			other := open(t, d.url(t, "", nil))
			admin := d.admin(t)
			k := testKey(t, "")
			mustRelease(t, ctx, mustAcquire(t, ctx, l, testKey(t, "/init"))) // the tables exist

			// Another transaction makes the upsert of k (a key without a
			// row) wait, but not an UPDATE of k's row: PostgreSQL, an
			// uncommitted row of the key (which the UPDATE does not see);
			// MariaDB, a gap lock on the key (which does not conflict with
			// the UPDATE's).
			tx, err := admin.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			block := "INSERT INTO " + d.table("") + " (lock_key, owner, token, expires_us) VALUES ($1, 'blocker', 1, 0)"
			if d.name == "MariaDB" {
				block = "SELECT lock_key FROM " + d.table("") + " WHERE lock_key = ? FOR UPDATE"
			}
			if d.name == "MariaDB" {
				var got []byte
				if err := tx.QueryRowContext(ctx, block, k).Scan(&got); !errors.Is(err, sql.ErrNoRows) {
					t.Fatalf("lock the gap of %q: %v", k, err)
				}
			} else if _, err := tx.ExecContext(ctx, block, k); err != nil {
				t.Fatal(err)
			}
			actx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				h, err := l.Acquire(actx, k)
				if h != nil {
					_ = h.Release(context.Background())
				}
				done <- err
			}()
			for deadline := time.Now().Add(30 * time.Second); !upsertWaiting(t, d, admin); {
				if time.Now().After(deadline) {
					t.Fatal("the acquire statement never waited for the row lock")
				}
				time.Sleep(5 * time.Millisecond)
			}
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled Acquire = %v, want context.Canceled", err)
			}
			// Nothing marks the clean-up's first drop; this pause lets it run
			// before the upsert can commit, so that a clean-up that drops
			// only once is caught. It does not make the test pass.
			time.Sleep(300 * time.Millisecond)
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
			defer wcancel()
			start := time.Now()
			h, err := other.Acquire(wctx, k)
			if err != nil {
				owner, _, _, _ := rowOf(t, d, admin, k)
				t.Fatalf("the key is still blocked %v after the cancelled Acquire (row owner %q): %v", time.Since(start), owner, err)
			}
			t.Logf("key free again after %v", time.Since(start))
			mustRelease(t, ctx, h)
		})
	}
}
