package sqltable

import (
	"fmt"
	"testing"
	"time"
)

// These tests reach inside the package: the wake-up hub's keys and queue.
// Those that need a database are with the SQLite driver package
// (sqltable/sqlite), as the tests of this package import no driver.

func pending(w *waiter) bool {
	select {
	case <-w.c:
		return true
	default:
		return false
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

// TestFamStmtParams: the families' statements are written with $n
// parameters; SQLite gets ?n, MySQL positional ? with the arguments put in
// the order of their use (a parameter used twice is passed twice).
func TestFamStmtParams(t *testing.T) {
	q := "SELECT $2, $1 WHERE x = $2"
	if got := famStmt(PostgreSQL, q); got.text != q || got.order != nil {
		t.Errorf("PostgreSQL: %+v", got)
	}
	if got := famStmt(SQLite, q); got.text != "SELECT ?2, ?1 WHERE x = ?2" {
		t.Errorf("SQLite: %q", got.text)
	}
	got := famStmt(MySQL, q)
	if got.text != "SELECT ?, ? WHERE x = ?" {
		t.Errorf("MySQL: %q", got.text)
	}
	if args := fmt.Sprint(got.args("a", "b")); args != "[b a b]" {
		t.Errorf("MySQL args: %s, want [b a b]", args)
	}
	// Every statement of every dialect takes as many arguments as its
	// callers pass: none is left out or out of range.
	for _, d := range []Dialect{PostgreSQL, MySQL, SQLite} {
		s := newFamStatements(d, tableName{name: "t"})
		for i, st := range s.all() {
			for _, j := range st.order {
				if j < 0 || j > 7 {
					t.Errorf("%v statement %d: argument %d", d, i, j+1)
				}
			}
		}
	}
}

// TestFamID: a family's hub ID never equals a mutex key's (valid keys have
// no NUL byte), nor another family's.
func TestFamID(t *testing.T) {
	if famID(famRW, "k") == famID(famSem, "k") || famID(famRW, "k") == "k" {
		t.Error("family IDs collide")
	}
}
