package sqltable

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// These tests reach inside the package: the wake-up hub's keys and queue,
// a hook between an Acquire's registration and its return, a Release's
// claim.

func openFile(t *testing.T, p string) *sql.DB {
	t.Helper()
	return openBusy(t, p, 5000)
}

// openBusy opens the SQLite file p with a busy timeout of ms milliseconds.
func openBusy(t *testing.T, p string, ms int) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", fmt.Sprintf("%s?_pragma=busy_timeout(%d)", p, ms))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func started(t *testing.T, l *Locker) {
	t.Helper()
	h, err := l.TryAcquire(context.Background(), "init")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func pending(w *waiter) bool {
	select {
	case <-w.c:
		return true
	default:
		return false
	}
}

// TestHubKeyNamesTheDatabase: Lockers on two database files with tables of
// the same name do not share wake-ups; two pools on one file do.
func TestHubKeyNamesTheDatabase(t *testing.T) {
	dir := t.TempDir()
	a := New(openFile(t, filepath.Join(dir, "a.db")))
	a2 := New(openFile(t, filepath.Join(dir, "a.db")))
	b := New(openFile(t, filepath.Join(dir, "b.db")))
	for _, l := range []*Locker{a, a2, b} {
		t.Cleanup(func() { l.Close() })
		started(t, l)
	}
	if a.hubKey == b.hubKey {
		t.Fatalf("Lockers on a.db and b.db share the wake-up key %q", a.hubKey)
	}
	if a.hubKey != a2.hubKey {
		t.Fatalf("two pools on a.db have wake-up keys %q and %q; want one", a.hubKey, a2.hubKey)
	}

	ctx := context.Background()
	w := procHub.watch(a.hubKey, "k")
	defer procHub.leave(w, false)
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

// TestWakeUpPassedOn: a waiter that took a wake-up and leaves without the
// lock, before acting on it, passes it to the next waiter; one that acted
// on it (tried and found the key held) or took the lock does not.
func TestWakeUpPassedOn(t *testing.T) {
	const table = "test:passed-on"
	w1 := procHub.watch(table, "k")
	w2 := procHub.watch(table, "k")
	procHub.wake(table, "k", "")
	if !pending(w1) || pending(w2) {
		t.Fatal("the release did not wake the head waiter alone")
	}
	w1.woken()
	procHub.leave(w1, true) // ctx ended before it tried
	if !pending(w2) {
		t.Fatal("the wake-up w1 took and did not act on was lost")
	}
	w2.woken()
	w2.acted() // tried, found the key held
	w3 := procHub.watch(table, "k")
	procHub.leave(w2, true)
	if pending(w3) {
		t.Fatal("a wake-up already acted on was passed on")
	}
	procHub.wake(table, "k", "")
	w3.woken()
	w4 := procHub.watch(table, "k")
	procHub.leave(w3, false) // took the lock
	if pending(w4) {
		t.Fatal("a waiter that took the lock passed a wake-up on")
	}
	procHub.leave(w4, false)
}

// TestWakeTable: a wake of a whole table (a reconnected listener, an
// SQLite signal file) wakes the head waiter of each of its keys and no
// waiter of another table; the hub forgets a table once nobody waits on it.
func TestWakeTable(t *testing.T) {
	const t1, t2 = "test:wake-table-1", "test:wake-table-2"
	a1, a2 := procHub.watch(t1, "a"), procHub.watch(t1, "a")
	b := procHub.watch(t1, "b")
	other := procHub.watch(t2, "a")
	procHub.wakeTable(t1)
	if w1, w2, wb := pending(a1), pending(a2), pending(b); !w1 || w2 || !wb {
		t.Fatalf("woken: a's head %t, a's second %t, b's head %t; want true, false, true", w1, w2, wb)
	}
	if pending(other) {
		t.Fatal("a wake of one table woke a waiter of another")
	}
	for _, w := range []*waiter{a1, a2, b, other} {
		procHub.leave(w, false)
	}
	procHub.mu.Lock()
	defer procHub.mu.Unlock()
	if _, ok := procHub.tables[t1]; ok {
		t.Fatal("the hub keeps a table nobody waits on")
	}
	if _, ok := procHub.tables[t2]; ok {
		t.Fatal("the hub keeps a table nobody waits on")
	}
}

// TestAcquireRacingClose: when Close begins between the registration of an
// Acquire's Handle and its return, the Acquire returns an error wrapping
// locker.ErrClosed (not a Handle that Close has ended), and the row is
// released once, by Close.
func TestAcquireRacingClose(t *testing.T) {
	db := openFile(t, filepath.Join(t.TempDir(), "l.db"))
	l := New(db)
	started(t, l)
	closed := make(chan error, 1)
	testHookKeep = func(h *Handle) {
		go func() { closed <- l.Close() }()
		select {
		case <-h.Done():
		case <-time.After(30 * time.Second):
			t.Error("Close did not end the registered Handle")
		}
	}
	defer func() { testHookKeep = nil }()
	h, err := l.TryAcquire(context.Background(), "k")
	testHookKeep = nil
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
	db := openBusy(t, p, 60000)
	l := New(db)
	ctx := context.Background()
	lh, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	h := lh.(*Handle)
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
		if h.c.Claimed() {
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

// TestRecentReleases: a release heard twice is told apart within
// releaseMemory; the hub forgets the oldest IDs first, by age and beyond
// maxReleases, so that what it keeps stays bounded however many releases
// it hears, and its list does not grow without bound either.
func TestRecentReleases(t *testing.T) {
	r := recentReleases{at: map[string]time.Time{}}
	t0 := time.Now()
	if r.heard("a", t0) {
		t.Fatal("a new release reported as heard")
	}
	if !r.heard("a", t0.Add(time.Second)) {
		t.Fatal("a release heard again within releaseMemory not recognised")
	}
	// Past releaseMemory, "a" is forgotten as soon as another comes.
	later := t0.Add(releaseMemory + time.Millisecond)
	if r.heard("b", later) {
		t.Fatal("b reported as heard")
	}
	if _, ok := r.at["a"]; ok {
		t.Fatal("a still remembered past releaseMemory")
	}
	// Many releases in one instant: the oldest go first, the newest stay.
	now := later
	for i := range 3 * maxReleases {
		if r.heard(fmt.Sprint(i), now) {
			t.Fatalf("release %d reported as heard", i)
		}
		if len(r.at) > maxReleases {
			t.Fatalf("%d releases remembered, more than %d", len(r.at), maxReleases)
		}
	}
	if !r.heard(fmt.Sprint(3*maxReleases-1), now) || !r.heard(fmt.Sprint(2*maxReleases+1), now) {
		t.Fatal("a recent release forgotten")
	}
	if _, ok := r.at["0"]; ok {
		t.Fatal("the oldest release still remembered")
	}
	if n := len(r.order) - r.head; n != len(r.at) {
		t.Fatalf("%d IDs in the list, %d in the map", n, len(r.at))
	}
	if cap(r.order) > 4*maxReleases {
		t.Fatalf("the list grew to %d entries for %d remembered", cap(r.order), len(r.at))
	}
}

// BenchmarkRecentReleases: one release heard per op, by a process that
// has heard many (the steady state of a busy one).
func BenchmarkRecentReleases(b *testing.B) {
	r := recentReleases{at: map[string]time.Time{}}
	ids := make([]string, 4*maxReleases)
	for i := range ids {
		ids[i] = fmt.Sprint("release-", i)
	}
	for _, id := range ids[:maxReleases] {
		r.heard(id, time.Now())
	}
	b.ResetTimer()
	for i := range b.N {
		r.heard(ids[i%len(ids)]+"-"+fmt.Sprint(i/len(ids)), time.Now())
	}
}

// TestHeardMarkPerWaiters: a release heard by the waiters of one identity
// (the releasing Locker's own wake) does not stop its report to the waiters
// of another identity of the same table and key (a listener's NOTIFY), nor
// does a report that reached no waiter; a second report to the same
// waiters is a duplicate and wakes nobody.
func TestHeardMarkPerWaiters(t *testing.T) {
	ta, tb := "pg:identity-a:locks", "pg:identity-b:locks"
	wb := procHub.watch(tb, "k")
	defer procHub.leave(wb, false)

	procHub.wake(ta, "k", "owner-1") // the releasing Locker's own wake: no waiter of ta
	if pending(wb) {
		t.Fatal("a wake of identity a woke a waiter of identity b")
	}
	procHub.wake(tb, "k", "owner-1") // the NOTIFY, through b's listener
	if !pending(wb) {
		t.Fatal("the NOTIFY of a release was dropped as heard: the releasing Locker's own wake of another identity marked it")
	}
	procHub.wake(tb, "k", "owner-1") // another listener's copy
	if pending(wb) {
		t.Fatal("the same release woke the waiters of one identity twice")
	}

	wa := procHub.watch(ta, "k")
	defer procHub.leave(wa, false)
	procHub.wake(ta, "k", "owner-1") // reached nobody of ta before: not heard there
	if !pending(wa) {
		t.Fatal("a report that reached no waiter marked the release heard")
	}
}
