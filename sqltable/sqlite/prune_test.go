package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/sqltable"
)

// sqliteRow reads key's row of the default table; ok is false without one.
func sqliteRow(t *testing.T, db *sql.DB, key string) (owner string, token, expires int64, ok bool) {
	t.Helper()
	err := db.QueryRow(`SELECT owner, token, expires_us FROM "locker_locks" WHERE lock_key = ?`, key).Scan(&owner, &token, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return "", 0, 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return owner, token, expires, true
}

func mustTry(t *testing.T, l *sqltable.Locker, key string) locker.Handle {
	t.Helper()
	h, err := l.TryAcquire(context.Background(), key)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", key, err)
	}
	return h
}

func mustExec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// TestPruneSparesFreshRows: a row released a moment ago is not pruned (it
// carries the release's time, not 0), nor is a row whose lease ran out long
// ago but whose token is recent; a row old on both counts is, and the key's
// next token is still above the pruned one.
func TestPruneSparesFreshRows(t *testing.T) {
	db, _ := sqliteDB(t)
	ctx := context.Background()
	l := newLocker(t, db)
	const k = "k"
	h := mustTry(t, l, k)
	last := h.Token()
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	owner, _, expires, ok := sqliteRow(t, db, k)
	if !ok || owner != "" || expires <= 0 {
		t.Fatalf("row after Release: owner %q, expires_us %d, present %v; want empty owner and the release's time", owner, expires, ok)
	}
	if n, err := l.Prune(ctx, sqltable.MinPruneAge); err != nil || n != 0 {
		t.Fatalf("Prune right after Release = %d, %v; want 0 (the row was in use a moment ago)", n, err)
	}

	h = mustTry(t, l, k)
	if h.Token() <= last {
		t.Fatalf("token %d not above %d", h.Token(), last)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A lease that ran out long ago, but a token that is recent (as after
	// many acquisitions within one clock tick, or a row released by an
	// earlier release with expires_us 0): not pruned.
	mustExec(t, db, `UPDATE "locker_locks" SET expires_us = 0 WHERE lock_key = ?`, k)
	if n, err := l.Prune(ctx, sqltable.MinPruneAge); err != nil || n != 0 {
		t.Fatalf("Prune of a row with a recent token = %d, %v; want 0", n, err)
	}
	// Old on both counts: pruned, and the next token is above it all the same.
	mustExec(t, db, `UPDATE "locker_locks" SET token = token - 120000000 WHERE lock_key = ?`, k)
	_, last, _, _ = sqliteRow(t, db, k)
	if n, err := l.Prune(ctx, sqltable.MinPruneAge); err != nil || n != 1 {
		t.Fatalf("Prune of an old row = %d, %v; want 1", n, err)
	}
	if _, _, _, ok := sqliteRow(t, db, k); ok {
		t.Fatal("the old row is still there after Prune")
	}
	h = mustTry(t, l, k)
	if h.Token() <= last {
		t.Errorf("token after Prune %d is not above the pruned row's %d", h.Token(), last)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPruneTokensNeverRepeat: release and prune in a tight loop; the key's
// first token after each Prune is above every token before it (SQLite's
// clock ticks in milliseconds, so a row pruned at once would hand out the
// same token twice within a tick).
func TestPruneTokensNeverRepeat(t *testing.T) {
	db, _ := sqliteDB(t)
	ctx := context.Background()
	l := newLocker(t, db)
	var last int64
	for i := range 100 {
		for range 3 {
			h := mustTry(t, l, "k")
			if h.Token() <= last {
				t.Fatalf("round %d: token %d not above %d", i, h.Token(), last)
			}
			last = h.Token()
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.Prune(ctx, sqltable.MinPruneAge); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReleasedRowFreeWhatever: a released row is free to take and shows as
// not held even when its expires_us lies ahead of the database's clock (the
// clock was stepped back after the release).
func TestReleasedRowFreeWhatever(t *testing.T) {
	db, _ := sqliteDB(t)
	ctx := context.Background()
	l := newLocker(t, db)
	h := mustTry(t, l, "k")
	last := h.Token()
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `UPDATE "locker_locks" SET expires_us = CAST(unixepoch('subsec') * 1000000 AS INTEGER) + 60000000 WHERE lock_key = 'k'`)
	info, err := l.Inspect(ctx, "k")
	if err != nil || info.Held {
		t.Fatalf("Inspect of a released row = %+v, %v; want not held", info, err)
	}
	h = mustTry(t, l, "k")
	if h.Token() <= last {
		t.Errorf("token %d not above %d", h.Token(), last)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
