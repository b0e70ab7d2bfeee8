package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/sqltable"
	"github.com/go-locker/locker/sqltable/internal/drivers"
)

// These tests reach, through drivers.Peek, inside sqltable's Locker: its
// wake-up identity and hub, a hook between an Acquire's registration and
// its return, a Release's claim. They run on SQLite, which needs no server,
// and are here rather than in package sqltable, whose tests import no
// driver (see drivers.Peek).

// TestHubKeyNamesTheDatabase: Lockers on two database files with tables of
// the same name do not share wake-ups; two pools on one file do.
func TestHubKeyNamesTheDatabase(t *testing.T) {
	dir := t.TempDir()
	a := sqltable.New(openFile(t, filepath.Join(dir, "a.db")))
	a2 := sqltable.New(openFile(t, filepath.Join(dir, "a.db")))
	b := sqltable.New(openFile(t, filepath.Join(dir, "b.db")))
	for _, l := range []*sqltable.Locker{a, a2, b} {
		t.Cleanup(func() { l.Close() })
		started(t, l)
	}
	hubKey := drivers.Peek.HubKey
	if hubKey(a) == hubKey(b) {
		t.Fatalf("Lockers on a.db and b.db share the wake-up key %q", hubKey(a))
	}
	if hubKey(a) != hubKey(a2) {
		t.Fatalf("two pools on a.db have wake-up keys %q and %q; want one", hubKey(a), hubKey(a2))
	}

	ctx := context.Background()
	w := watch(t, a, "k")
	hb, err := b.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := hb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if pending(w) {
		t.Fatal("a release on b.db woke a waiter on a.db")
	}
	ha, err := a2.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := ha.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !pending(w) {
		t.Fatal("a release on a.db through another pool did not wake a.db's waiter")
	}
}

// TestAcquireRacingClose: when Close begins between the registration of an
// Acquire's Handle and its return, the Acquire returns an error wrapping
// locker.ErrClosed (not a Handle that Close has ended), and the row is
// released once, by Close.
func TestAcquireRacingClose(t *testing.T) {
	db := openFile(t, filepath.Join(t.TempDir(), "l.db"))
	l := sqltable.New(db)
	started(t, l)
	closed := make(chan error, 1)
	drivers.Peek.SetKeepHook(func(h any) {
		go func() { closed <- l.Close() }()
		select {
		case <-h.(locker.Handle).Done():
		case <-time.After(30 * time.Second):
			t.Error("Close did not end the registered Handle")
		}
	})
	defer drivers.Peek.SetKeepHook(nil)
	h, err := l.TryAcquire(context.Background(), "k")
	drivers.Peek.SetKeepHook(nil)
	if !errors.Is(err, locker.ErrClosed) || h != nil {
		t.Fatalf("TryAcquire racing Close = %v, %v; want nil and an error wrapping ErrClosed", h, err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	var owner string
	if err := db.QueryRow(`SELECT owner FROM "locker_locks" WHERE lock_key = 'k'`).Scan(&owner); err != nil || owner != "" {
		t.Fatalf("row after Close: owner %q, %v; want released", owner, err)
	}
}

// TestCloseBoundsReleaseInFlight: a Release already in flight when Close
// begins (its statement waits for another connection's write lock) holds
// Close up at most locker.ReleaseTimeout, although the statement would wait
// a minute, and its error says that Close cut it short, not that anything
// frees the row in the background.
func TestCloseBoundsReleaseInFlight(t *testing.T) {
	p := filepath.Join(t.TempDir(), "l.db")
	db, err := sql.Open("sqlite", p+"?_pragma=busy_timeout(60000)&_pragma=synchronous(NORMAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	l := sqltable.New(db)
	ctx := context.Background()
	h, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	// Another connection takes the database's write lock.
	other := openFile(t, p)
	c, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			_, _ = c.ExecContext(ctx, "ROLLBACK")
		}
	}
	defer unlock()

	relErr := make(chan error, 1)
	go func() { relErr <- h.Release(context.Background()) }()
	// Wait until the Release has claimed the lock (then Close leaves it to
	// the Release).
	for deadline := time.Now().Add(10 * time.Second); ; {
		if drivers.Peek.Claimed(h) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Release did not claim the lock")
		}
		time.Sleep(time.Millisecond)
	}
	closeErr := make(chan error, 1)
	start := time.Now()
	go func() { closeErr <- l.Close() }()
	bound := locker.ReleaseTimeout + 5*time.Second // slack for a loaded machine
	select {
	case <-closeErr:
		t.Logf("Close took %v", time.Since(start))
	case <-time.After(bound):
		unlock()
		<-closeErr
		t.Fatalf("Close waited more than %v for a Release in flight", bound)
	}
	err = <-relErr
	if !errors.Is(err, locker.ErrClosed) || strings.Contains(err.Error(), "background") {
		t.Fatalf("Release cut short by Close = %v; want an error wrapping ErrClosed that promises no background release", err)
	}
	if !errors.Is(h.Err(), locker.ErrReleased) {
		t.Errorf("Err after Release = %v, want ErrReleased", h.Err())
	}
}
