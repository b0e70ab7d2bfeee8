package sqltable_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/sqltable"
)

// The lock families (semaphores, reader-writer locks) on the families
// table: its windows the conformance suite does not reach (a cut permit
// holder, a waiter whose wait lapses, a row deleted from outside), and the
// families table added to the tables of a release without it.

// famTTL is the lease of the fault tests.
const famTTL = 2 * time.Second

// faultLocker returns a Locker of d on the default table whose link to the
// database the test can cut (every statement hangs until heal).
func faultLocker(t *testing.T, d dialect) (l *sqltable.Locker, cut func() (heal func())) {
	t.Helper()
	if d.name == "SQLite" {
		db, f := openFaultDB(t, sqliteFile(t)+"?_pragma=busy_timeout(50)&_pragma=synchronous(NORMAL)")
		db.SetMaxOpenConns(4)
		l := sqltable.New(db, sqltable.WithDialect(sqltable.SQLite))
		t.Cleanup(func() { l.Close() })
		return l, f.Cut
	}
	px := testserver.NewProxy(t, d.addr(t))
	l = open(t, d.url(t, px.Addr(), nil))
	return l, func() func() {
		px.Partition(t)
		return func() { px.Heal(t) }
	}
}

type famResult struct {
	h   locker.Handle
	err error
	at  time.Time
}

func goFam(f func() (locker.Handle, error)) <-chan famResult {
	c := make(chan famResult, 1)
	go func() {
		h, err := f()
		c <- famResult{h, err, time.Now()}
	}()
	return c
}

// queued waits until key of family has n rows besides its head (holders
// and waiters), as the admin connection sees them.
func queued(t *testing.T, ctx context.Context, d dialect, key string, n int) {
	t.Helper()
	admin := d.admin(t)
	q := fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE lock_key = %s AND seq > 0", d.table("_fam"), d.ph(1))
	deadline := time.Now().Add(10 * time.Second)
	for {
		var got int
		if err := admin.QueryRowContext(ctx, q, key).Scan(&got); err != nil {
			t.Fatalf("count the rows of %q: %v", key, err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %q has %d rows, want %d", key, got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestFamiliesCutHolder: the holder of the one permit of a semaphore is
// cut off from the database. It reports the loss by its own clock, and the
// permit goes to a waiter once the lease has run out on the database, not
// before the cut holder knows, with a greater token.
func TestFamiliesCutHolder(t *testing.T) {
	forEach(t, func(t *testing.T, d dialect) {
		ctx := testCtx(t)
		key := testKey(t, "")
		cutL, cut := faultLocker(t, d)
		other := open(t, d.url(t, "", nil))
		h, err := cutL.TryAcquireSemaphore(ctx, key, 1, locker.WithTTL(famTTL))
		if err != nil {
			t.Fatal(err)
		}
		waiting := goFam(func() (locker.Handle, error) {
			return other.AcquireSemaphore(ctx, key, 1, locker.WithTTL(famTTL))
		})
		queued(t, ctx, d, key, 2)
		start := time.Now()
		heal := cut()
		defer heal()
		var r famResult
		select {
		case r = <-waiting:
		case <-time.After(famTTL + 3*time.Second):
			t.Fatalf("the waiter did not get the permit of a cut holder within %v", famTTL+3*time.Second)
		}
		if r.err != nil {
			t.Fatalf("the waiter: %v", r.err)
		}
		defer r.h.Release(ctx)
		t.Logf("the permit of the cut holder reached the waiter after %v", r.at.Sub(start))
		select {
		case <-h.Done():
		default:
			t.Fatal("the waiter got the permit while the cut holder still counted it as held")
		}
		if !errors.Is(h.Err(), locker.ErrLost) {
			t.Errorf("the cut holder's Err: %v, want ErrLost", h.Err())
		}
		if r.h.Token() <= h.Token() {
			t.Errorf("the waiter's token %d is not above the cut holder's %d", r.h.Token(), h.Token())
		}
	})
}

// TestFamiliesWaiterLapses: a writer waiting behind a reader is cut off
// from the database, and a second writer waits behind it. Once the reader
// leaves, the second writer must not wait for the cut one for ever: the
// cut writer's row lapses a wait lease (here the TTL) after its last look,
// and the second gets the key. The cut writer, healed, queues again and
// gets the key after it.
func TestFamiliesWaiterLapses(t *testing.T) {
	forEach(t, func(t *testing.T, d dialect) {
		ctx := testCtx(t)
		key := testKey(t, "")
		cutL, cut := faultLocker(t, d)
		a, b := open(t, d.url(t, "", nil)), open(t, d.url(t, "", nil))
		reader, err := a.TryAcquireRead(ctx, key, locker.WithTTL(famTTL))
		if err != nil {
			t.Fatal(err)
		}
		first := goFam(func() (locker.Handle, error) { return cutL.AcquireWrite(ctx, key, locker.WithTTL(famTTL)) })
		queued(t, ctx, d, key, 2)
		second := goFam(func() (locker.Handle, error) { return b.AcquireWrite(ctx, key, locker.WithTTL(famTTL)) })
		queued(t, ctx, d, key, 3)
		heal := cut()
		start := time.Now()
		mustRelease(t, ctx, reader)
		var r famResult
		select {
		case r = <-second:
		case r = <-first:
			t.Fatalf("the cut writer got the key: %v", r.err)
		case <-time.After(famTTL + 3*time.Second):
			t.Fatalf("the second writer still waits %v after the reader left: the cut writer ahead of it blocks it", famTTL+3*time.Second)
		}
		if r.err != nil {
			t.Fatalf("the second writer: %v", r.err)
		}
		t.Logf("the second writer got the key %v after the reader left (the cut writer's wait lapsed)", r.at.Sub(start))
		heal()
		select {
		case r1 := <-first:
			t.Fatalf("the healed writer got the key while the second writer holds it: %v", r1.err)
		case <-time.After(200 * time.Millisecond):
		}
		mustRelease(t, ctx, r.h)
		select {
		case r1 := <-first:
			if r1.err != nil {
				t.Fatalf("the healed writer: %v", r1.err)
			}
			if r1.h.Token() <= r.h.Token() {
				t.Errorf("the healed writer's token %d is not above the second writer's %d", r1.h.Token(), r.h.Token())
			}
			mustRelease(t, ctx, r1.h)
		case <-time.After(10 * time.Second):
			t.Fatal("the healed writer did not get the key once it was free")
		}
	})
}

// TestFamiliesRowDeleted: a reader's row deleted from outside (an operator,
// a restore): the reader learns at its next renewal (Done, ErrLost), its
// Release returns ErrLost, and a writer gets the key at once; the robbed
// reader's Release touches nothing of the writer's.
func TestFamiliesRowDeleted(t *testing.T) {
	forEach(t, func(t *testing.T, d dialect) {
		ctx := testCtx(t)
		key := testKey(t, "")
		a, b := open(t, d.url(t, "", nil)), open(t, d.url(t, "", nil))
		r, err := a.TryAcquireRead(ctx, key, locker.WithTTL(famTTL))
		if err != nil {
			t.Fatal(err)
		}
		admin := d.admin(t)
		res, err := admin.ExecContext(ctx, fmt.Sprintf("DELETE FROM %s WHERE lock_key = %s AND seq > 0", d.table("_fam"), d.ph(1)), key)
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			t.Fatalf("deleted %d rows, want 1", n)
		}
		w, err := b.TryAcquireWrite(ctx, key, locker.WithTTL(famTTL))
		if err != nil {
			t.Fatalf("a writer once the reader's row is gone: %v", err)
		}
		took := waitDone(t, r, famTTL/3+2*time.Second, "the reader whose row was deleted")
		t.Logf("the reader learnt of the loss after %v", took)
		if !errors.Is(r.Err(), locker.ErrLost) {
			t.Errorf("the robbed reader's Err: %v, want ErrLost", r.Err())
		}
		if err := r.Release(ctx); !errors.Is(err, locker.ErrLost) {
			t.Errorf("the robbed reader's Release: %v, want ErrLost", err)
		}
		if _, err := a.TryAcquireRead(ctx, key); !errors.Is(err, locker.ErrNotAcquired) {
			t.Errorf("a reader while the writer holds the key: %v, want ErrNotAcquired (the robbed reader's Release freed the writer's lock?)", err)
		}
		mustRelease(t, ctx, w)
	})
}

// TestFamiliesAddedToOldTables: tables made by a release without lock
// families (the lock table and the meta table, schema_version 1, no
// families table). A Locker with WithoutDDL keeps its mutexes and refuses
// the families with an error that gives the statements to run; a Locker
// allowed DDL adds the families table, after which both work.
func TestFamiliesAddedToOldTables(t *testing.T) {
	forEach(t, func(t *testing.T, d dialect) {
		ctx := testCtx(t)
		name := fmt.Sprintf("old_%d", time.Now().UnixNano()%1e12)
		dialect := map[string]sqltable.Dialect{"SQLite": sqltable.SQLite, "PostgreSQL": sqltable.PostgreSQL, "MariaDB": sqltable.MySQL}[d.name]
		stmts, err := sqltable.DDL(dialect, name)
		if err != nil {
			t.Fatal(err)
		}
		admin := d.admin(t)
		for _, s := range stmts[:3] { // the lock table, the meta table, schema_version: release 1
			if _, err := admin.ExecContext(ctx, s); err != nil {
				t.Fatalf("%s: %v", s, err)
			}
		}
		q := func(s string) string {
			if d.name == "MariaDB" {
				return "`" + s + "`"
			}
			return `"` + s + `"`
		}
		t.Cleanup(func() {
			for _, s := range []string{name, name + "_meta", name + "_fam"} {
				_, _ = admin.Exec("DROP TABLE IF EXISTS " + q(s))
			}
		})
		key := testKey(t, "")
		noDDL := open(t, d.url(t, "", url.Values{"lock_table": {name}, "ddl": {"false"}}))
		h, err := noDDL.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("the mutex on the old tables, WithoutDDL: %v", err)
		}
		mustRelease(t, ctx, h)
		_, err = noDDL.TryAcquireSemaphore(ctx, key, 2)
		if err == nil || !strings.Contains(err.Error(), "CREATE TABLE") || !strings.Contains(err.Error(), name+"_fam") {
			t.Fatalf("a semaphore on the old tables, WithoutDDL: %v; want an error giving the statements that create %s_fam", err, name)
		}
		t.Logf("WithoutDDL: %v", err)

		withDDL := open(t, d.url(t, "", url.Values{"lock_table": {name}}))
		s, err := withDDL.TryAcquireSemaphore(ctx, key, 2)
		if err != nil {
			t.Fatalf("a semaphore on the old tables, with DDL: %v", err)
		}
		mustRelease(t, ctx, s)
		var v string
		if err := admin.QueryRowContext(ctx, "SELECT value FROM "+q(name+"_meta")+" WHERE name = 'families_version'").Scan(&v); err != nil || v != "1" {
			t.Errorf("families_version: %q, %v; want 1", v, err)
		}
		if err := admin.QueryRowContext(ctx, "SELECT value FROM "+q(name+"_meta")+" WHERE name = 'schema_version'").Scan(&v); err != nil || v != "1" {
			t.Errorf("schema_version: %q, %v; want 1, unchanged (older releases keep using the lock table)", v, err)
		}
		// The Locker without DDL works now too (its next call looks again).
		r, err := noDDL.TryAcquireRead(ctx, key)
		if err != nil {
			t.Fatalf("a read lock WithoutDDL once the families table exists: %v", err)
		}
		mustRelease(t, ctx, r)
	})
}

// famChildEnv makes the test binary a holder of TestFamiliesAcrossProcesses:
// it names the URL; famKeyEnv the key.
const (
	famChildEnv = "LOCKER_TEST_SQLTABLE_FAM_CHILD"
	famKeyEnv   = "LOCKER_TEST_SQLTABLE_FAM_KEY"
)

// famChild, in a child process, takes the write lock of the key, says
// "held", and on a line from its standard input releases it and says
// "released <unix ns>".
func famChild() (code int, isChild bool) {
	u := os.Getenv(famChildEnv)
	if u == "" {
		return 0, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := sqltable.Open(ctx, u)
	if err != nil {
		fmt.Fprintln(os.Stderr, "families child:", err)
		return 1, true
	}
	defer l.Close()
	h, err := l.TryAcquireWrite(ctx, os.Getenv(famKeyEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "families child:", err)
		return 1, true
	}
	fmt.Println("held")
	bufio.NewScanner(os.Stdin).Scan()
	at := time.Now().UnixNano()
	if err := h.Release(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "families child: Release:", err)
		return 1, true
	}
	fmt.Printf("released %d\n", at)
	return 0, true
}

// TestFamiliesAcrossProcesses: a writer in another process releases the key
// that readers of this process have waited for long enough for their
// back-off to reach seconds. The release wakes them (PostgreSQL:
// LISTEN/NOTIFY; SQLite: the signal file; MariaDB: the writer row's bell,
// GET_LOCK): they get the key within a second.
func TestFamiliesAcrossProcesses(t *testing.T) {
	forEach(t, func(t *testing.T, d dialect) {
		ctx := testCtx(t)
		key := testKey(t, "")
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), famChildEnv+"="+d.url(t, "", nil), famKeyEnv+"="+key)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer cmd.Wait()
		defer stdin.Close()
		out := bufio.NewScanner(stdout)
		if !out.Scan() || out.Text() != "held" {
			t.Fatalf("child: %q, want held", out.Text())
		}
		const retry = 5 * time.Second
		l := open(t, d.url(t, "", url.Values{"retry_interval": {retry.String()}}))
		readers := []<-chan famResult{
			goFam(func() (locker.Handle, error) { return l.AcquireRead(ctx, key) }),
			goFam(func() (locker.Handle, error) { return l.AcquireRead(ctx, key) }),
		}
		queued(t, ctx, d, key, 3)
		// The readers wait long enough for their back-off to have grown
		// to seconds: only a wake-up brings them the key within bound.
		time.Sleep(3 * time.Second)
		fmt.Fprintln(stdin, "R")
		if !out.Scan() {
			t.Fatal("child: no release")
		}
		var at int64
		if _, err := fmt.Sscanf(out.Text(), "released %d", &at); err != nil {
			t.Fatalf("child: %q: %v", out.Text(), err)
		}
		for i, c := range readers {
			select {
			case r := <-c:
				if r.err != nil {
					t.Fatalf("reader %d: %v", i, r.err)
				}
				took := r.at.Sub(time.Unix(0, at))
				t.Logf("reader %d got the key %v after the other process's release", i, took)
				if bound := time.Second; took > bound {
					t.Errorf("reader %d got the key %v after the release: more than %v, as if nothing woke it", i, took, bound)
				}
				defer r.h.Release(ctx)
			case <-time.After(retry + 3*time.Second):
				t.Fatalf("reader %d did not get the key within %v of the release", i, retry+3*time.Second)
			}
		}
	})
}

// TestFamiliesLongKeys: every valid key up to locker.MaxKeyLen bytes works
// in every family, as in the mutex: a key of 1024 bytes with multibyte
// characters, and keys that differ only in their last byte, are locks of
// their own; the three families of one key are three locks.
func TestFamiliesLongKeys(t *testing.T) {
	forEach(t, func(t *testing.T, d dialect) {
		ctx := testCtx(t)
		l := open(t, d.url(t, "", nil))
		base := testKey(t, "/") + strings.Repeat("é", 512)
		base = base[:locker.MaxKeyLen-1]
		for !utf8.ValidString(base) {
			base = base[:len(base)-1]
		}
		base += strings.Repeat("x", locker.MaxKeyLen-1-len(base))
		k1, k2 := base+"a", base+"b"
		var held []locker.Handle
		for _, k := range []string{k1, k2} {
			if len(k) != locker.MaxKeyLen {
				t.Fatalf("key of %d bytes", len(k))
			}
			w, err := l.TryAcquireWrite(ctx, k)
			if err != nil {
				t.Fatalf("TryAcquireWrite of a %d-byte key: %v", len(k), err)
			}
			s, err := l.TryAcquireSemaphore(ctx, k, 1)
			if err != nil {
				t.Fatalf("TryAcquireSemaphore of a %d-byte key: %v", len(k), err)
			}
			m, err := l.TryAcquire(ctx, k)
			if err != nil {
				t.Fatalf("TryAcquire of a %d-byte key: %v", len(k), err)
			}
			held = append(held, w, s, m)
		}
		if _, err := l.TryAcquireRead(ctx, k1); !errors.Is(err, locker.ErrNotAcquired) {
			t.Errorf("a reader of a written long key: %v, want ErrNotAcquired", err)
		}
		for _, h := range held {
			mustRelease(t, ctx, h)
		}
	})
}
