package sqltable_test

import (
	"context"
	"database/sql"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/go-locker/locker/integration/testserver"
)

// TestBellAcrossProcesses: on MySQL and MariaDB a waiter in another process
// learns of a release from the holder's bell (a named lock the holder takes
// a little after the grant and gives back after the release), not from its
// back-off. A child process holds the key with a one-hour lease; this
// process waits with a one-hour retry interval, so that its back-off grows
// to seconds. While it waits, a session of the server waits for a named
// lock (PROCESSLIST state "User lock"): the waiter, for the child's bell.
// Once the child releases, the waiter holds the key within a second.
func TestBellAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a child process")
	}
	d := dialectNamed(t, "MariaDB")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := d.url(t, "", url.Values{"retry_interval": {"1h"}, "ttl": {"1h"}})
	l := open(t, u)
	key := "bell/" + randomID()
	child := startHandoffChild(t, u, key)
	child.do(t, "A", "held")

	type result struct {
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	go func() {
		h, err := l.Acquire(ctx, key)
		r := result{time.Now(), err}
		if err == nil {
			defer h.Release(context.Background())
		}
		got <- r
	}()

	admin := openDB(t, "mysql", testserver.MySQL(t).DSN())
	waiting := false
	for deadline := time.Now().Add(10 * time.Second); !waiting && time.Now().Before(deadline); {
		var n int
		if err := admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock' AND INFO LIKE 'SELECT GET_LOCK%'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if waiting = n > 0; !waiting {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if !waiting {
		t.Fatal("no session waits for a named lock 10s into the wait: the waiter is not waiting for the holder's bell")
	}
	select {
	case r := <-got:
		t.Fatalf("Acquire returned while the child holds the key: %v", r.err)
	default:
	}

	line := child.do(t, "R", "released ")
	ns, err := strconv.ParseInt(line, 10, 64)
	if err != nil {
		t.Fatalf("child said %q", line)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("Acquire after the child's release: %v", r.err)
		}
		if took := r.at.Sub(time.Unix(0, ns)); took > time.Second {
			t.Errorf("the waiter took the key %v after the child's release; the bell should wake it within milliseconds", took)
		} else {
			t.Logf("handoff across processes: %v", took)
		}
	case <-ctx.Done():
		t.Fatal("the waiter did not get the key within a minute of the child's release")
	}
}

func dialectNamed(t testing.TB, name string) dialect {
	for _, d := range dialects {
		if d.name == name {
			return d
		}
	}
	t.Fatalf("no dialect %q", name)
	return dialect{}
}

// TestBellLeavesNoNamedLock: whatever the moment a lock ends relative to
// its ring (holds around the bell's 5ms delay, so that some releases come
// while the ring's GET_LOCK is in flight), no bell stays held once the lock
// has ended, and a bell is held while a lock is held long enough.
func TestBellLeavesNoNamedLock(t *testing.T) {
	d := dialectNamed(t, "MariaDB")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l := open(t, d.url(t, "", nil))
	admin := d.admin(t)
	key := "bell-leak/" + randomID()
	used := func() bool {
		var id sql.NullInt64
		if err := admin.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", l.BellName(key)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id.Valid
	}
	h, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !used(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no bell held 5s into a hold")
		}
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 60 {
		h, err := l.Acquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(4*time.Millisecond + time.Duration(i%20)*100*time.Microsecond)
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); used(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the key's bell is still held 5s after its last lock ended")
		}
	}
}

// TestBellUnrungDoesNotPoll: a key held by a Locker without a bell
// (lock_notify=false) gives a waiter's bell at once, every time; the waiter
// must then sleep its growing back-off, not poll once a round trip. Counted
// by the server's RELEASE_LOCKs (Com_do: only the bell runs DO) over a
// second of waiting: about ten with a back-off from 2ms, hundreds if each
// bell that came at once reset it.
func TestBellUnrungDoesNotPoll(t *testing.T) {
	d := dialectNamed(t, "MariaDB")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	holder := open(t, d.url(t, "", url.Values{"lock_notify": {"false"}}))
	waiter := open(t, d.url(t, "", nil))
	admin := d.admin(t)
	key := "bell-unrung/" + randomID()
	h, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release(context.Background())
	comDo := func() int64 {
		var name string
		var n int64
		if err := admin.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Com_do'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := comDo()
	wctx, wcancel := context.WithTimeout(ctx, time.Second)
	defer wcancel()
	if _, err := waiter.Acquire(wctx, key); err == nil {
		t.Fatal("Acquire of a held key succeeded")
	}
	if n := comDo() - before; n > 40 {
		t.Errorf("%d RELEASE_LOCKs in a second of waiting for a key held without a bell: the waiter polls instead of backing off", n)
	} else {
		t.Logf("%d RELEASE_LOCKs in a second of waiting", n)
	}
}
