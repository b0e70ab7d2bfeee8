package sqltable_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/sqltable"
)

// childEnv makes the test binary a worker of TestSQLiteProcesses: it names
// the directory holding the database and the counter files.
const childEnv = "LOCKER_TEST_SQLTABLE_CHILD_DIR"

const (
	childRounds = 25
	children    = 4
)

// TestSQLiteProcesses: several OS processes on one SQLite file take one
// key in turn and each time add one to a counter kept in a plain file with
// a read, a pause and a write; a lost update would show two holders at
// once. The fencing tokens, appended to a log under the lock, strictly
// increase.
func TestSQLiteProcesses(t *testing.T) {
	if dir := os.Getenv(childEnv); dir != "" {
		processWorker(t, dir)
		return
	}
	if testing.Short() {
		t.Skip("-short: starts child processes")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "counter"), []byte("0"), 0o600); err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	for range children {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSQLiteProcesses$", "-test.count=1", "-test.timeout=2m")
		cmd.Env = append(os.Environ(), childEnv+"="+dir)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("worker process: %v", err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "counter"))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(b); got != strconv.Itoa(children*childRounds) {
		t.Errorf("counter = %s after %d processes × %d rounds: updates were lost, so two processes held the lock at once", got, children, childRounds)
	}
	log, err := os.ReadFile(filepath.Join(dir, "tokens"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(log))
	if len(lines) != children*childRounds {
		t.Errorf("%d tokens logged, want %d", len(lines), children*childRounds)
	}
	var last int64
	for _, l := range lines {
		tok, err := strconv.ParseInt(l, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if tok <= last {
			t.Errorf("token %d logged after %d", tok, last)
		}
		last = tok
	}
}

func processWorker(t *testing.T, dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := sqltable.Open(ctx, "sqlite://"+filepath.Join(dir, "locks.db")+"?retry_interval=20ms")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	counter := filepath.Join(dir, "counter")
	for range childRounds {
		h, err := l.Acquire(ctx, "counter")
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(counter)
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(string(b))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // widen the window a second holder would use
		if err := os.WriteFile(counter, []byte(strconv.Itoa(n+1)), 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(filepath.Join(dir, "tokens"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(f, h.Token())
		f.Close()
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
