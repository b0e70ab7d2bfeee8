package sqlite

// These tests reach inside the package (the signal files of the process)
// and, through drivers.Peek, inside sqltable's Locker (its wake-up hub).

import (
	"context"
	"database/sql"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/sqltable"
	"github.com/go-locker/locker/sqltable/internal/drivers"
)

func openFile(t *testing.T, p string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", DSN(p))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// started makes l's first call (which joins the signal file).
func started(t *testing.T, l locker.Locker) {
	t.Helper()
	h, err := l.TryAcquire(context.Background(), "init")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// signalOf returns this process's signal of the database file p; nil when
// no Locker is on it.
func signalOf(p string) *fileWake {
	fileWakes.mu.Lock()
	defer fileWakes.mu.Unlock()
	return fileWakes.m[p+fileWakeSuffix]
}

// watch registers a waiter of key on l's table in sqltable's hub.
func watch(t *testing.T, l *sqltable.Locker, key string) <-chan struct{} {
	t.Helper()
	c, leave := drivers.Peek.Watch(drivers.Peek.HubKey(l), key)
	t.Cleanup(leave)
	return c
}

func pending(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// awaitWake waits, boundedly, for a wake-up of w.
func awaitWake(t *testing.T, w <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-w:
	case <-time.After(10 * time.Second):
		t.Fatalf("no wake-up within 10s of %s", what)
	}
}

// TestFileSignal: a release writes the database's signal file, and a write
// to it by anyone (another process) wakes the waiters of this process.
func TestFileSignal(t *testing.T) {
	p := filepath.Join(t.TempDir(), "locks.db")
	l := sqltable.New(openFile(t, p))
	t.Cleanup(func() { l.Close() })
	started(t, l)
	fw := signalOf(p)
	sig := p + fileWakeSuffix
	fi, err := os.Stat(sig)
	if err != nil {
		t.Fatalf("no signal file beside the database: %v", err)
	}
	if db, err := os.Stat(p); err != nil || fi.Mode().Perm() != db.Mode().Perm() {
		t.Errorf("signal file mode %v, want the database file's (%v, %v)", fi.Mode().Perm(), db.Mode().Perm(), err)
	}
	if fw == nil || !fw.start(context.Background()) || !fw.up() {
		t.Fatal("the signal file is not watched")
	}

	// A release signals.
	if err := os.Truncate(sig, 0); err != nil {
		t.Fatal(err)
	}
	started(t, l) // TryAcquire, Release
	if fi, err := os.Stat(sig); err != nil || fi.Size() != 1 {
		t.Fatalf("after a release the signal file has %v bytes (%v), want 1 written", fi.Size(), err)
	}

	// A write from outside wakes the head waiter of every waited key.
	w1 := watch(t, l, "k1")
	w2 := watch(t, l, "k2")
	drain := func(w <-chan struct{}) {
		for pending(w) {
		}
	}
	drain(w1)
	drain(w2)
	if err := os.WriteFile(sig, []byte{1}, 0o600); err != nil {
		t.Fatal(err)
	}
	awaitWake(t, w1, "a write to the signal file (k1)")
	awaitWake(t, w2, "a write to the signal file (k2)")

	// The file removed and created again (a clean-up of the directory): it
	// is watched again.
	if err := os.Remove(sig); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(sig); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the removed signal file was not created again")
		}
		time.Sleep(5 * time.Millisecond)
	}
	drain(w1)
	if err := os.WriteFile(sig, []byte{1}, 0o600); err != nil {
		t.Fatal(err)
	}
	awaitWake(t, w1, "a write to the signal file created again")

	// The last Locker on the file stops the watch.
	l.Close()
	if fw.up() {
		t.Error("the watch outlived the last Locker on the file")
	}
}

// TestFileSignalOff: with WithNotify(false) (lock_notify=false) a Locker
// does not watch the signal file, but its releases still write it, for the
// waiters of other processes, even after the file was removed.
func TestFileSignalOff(t *testing.T) {
	dir := t.TempDir()
	l, err := locker.Open(context.Background(), "sqlite://"+dir+"/locks.db?lock_notify=false")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	started(t, l)
	if fw := signalOf(filepath.Join(dir, "locks.db")); fw == nil || fw.start(context.Background()) || fw.up() {
		t.Error("a Locker with lock_notify=false watches the signal file")
	}
	sig := filepath.Join(dir, "locks.db"+fileWakeSuffix)
	if err := os.Remove(sig); err != nil {
		t.Fatalf("the Locker made no signal file: %v", err)
	}
	started(t, l)
	if fi, err := os.Stat(sig); err != nil || fi.Size() != 1 {
		t.Fatalf("a release after the signal file was removed did not write a new one (%v)", err)
	}
}

// TestFileSignalMode: the signal file gets the database file's permissions
// whatever the umask, so that every process that may write the database
// may signal.
func TestFileSignalMode(t *testing.T) {
	dir := t.TempDir()
	l, err := locker.Open(context.Background(), "sqlite://"+dir+"/locks.db?lock_file_mode=0666")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	started(t, l)
	db, err := os.Stat(filepath.Join(dir, "locks.db"))
	if err != nil {
		t.Fatal(err)
	}
	sig, err := os.Stat(filepath.Join(dir, "locks.db"+fileWakeSuffix))
	if err != nil {
		t.Fatal(err)
	}
	if db.Mode().Perm() != 0o666 || sig.Mode().Perm() != 0o666 {
		t.Errorf("database file %v, signal file %v; want both 0666", db.Mode().Perm(), sig.Mode().Perm())
	}
}

// signalChildEnv makes the test binary the holder of
// TestFileSignalAcrossProcesses: it names the database file.
const signalChildEnv = "LOCKER_TEST_SQLTABLE_SIGNAL_DB"

// TestFileSignalAcrossProcesses: a waiter whose only way to learn of the
// release in another process is the signal file (its retry interval and
// the holder's lease are an hour) gets the key when that process releases.
func TestFileSignalAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	if p := os.Getenv(signalChildEnv); p != "" {
		l := sqltable.New(openFile(t, p), sqltable.WithDefaultTTL(time.Hour))
		defer l.Close()
		h, err := l.TryAcquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		os.Stdout.WriteString("held\n")
		_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes it
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		return
	}
	if testing.Short() {
		t.Skip("-short: starts a child process")
	}
	p := filepath.Join(t.TempDir(), "locks.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestFileSignalAcrossProcesses$", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), signalChildEnv+"="+p)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	buf := make([]byte, 5)
	if _, err := io.ReadFull(out, buf); err != nil || string(buf) != "held\n" {
		t.Fatalf("the child did not take the key: %q, %v", buf, err)
	}

	l := sqltable.New(openFile(t, p), sqltable.WithRetryInterval(time.Hour))
	t.Cleanup(func() { l.Close() })
	started(t, l)
	got := make(chan error, 1)
	go func() {
		h, err := l.Acquire(ctx, "k")
		if err == nil {
			err = h.Release(ctx)
		}
		got <- err
	}()
	// Wait until the Acquire sleeps in the hub, watching the file, so that
	// the release can reach it only through the signal.
	deadline := time.Now().Add(30 * time.Second)
	for !drivers.Peek.Waiting(drivers.Peek.HubKey(l), "k") || !signalOf(p).up() {
		if time.Now().After(deadline) {
			t.Fatal("the Acquire did not start waiting")
		}
		time.Sleep(5 * time.Millisecond)
	}
	in.Close() // the child releases
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter did not get the key within 30s of the other process's release (its retry interval and the lease are an hour, so only the signal file could wake it)")
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("child: %v", err)
	}
}
