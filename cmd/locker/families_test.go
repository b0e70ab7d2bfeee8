package main

import (
	"bufio"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// holdProc is a running `locker hold` and the token it printed.
type holdProc struct {
	stop  func()
	token int64
}

// startHold runs `locker hold ARGS...` and waits for its token.
func (e *env) startHold(args ...string) holdProc {
	e.t.Helper()
	c := e.cmd(append([]string{"hold"}, args...)...)
	stdout, err := c.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	var errb strings.Builder
	c.Stderr = &errb
	if err := c.Start(); err != nil {
		e.t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = c.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				e.t.Errorf("locker hold %v after SIGTERM: %v (stderr %q)", args, err, errb.String())
			}
		case <-time.After(15 * time.Second):
			_ = c.Process.Kill()
			e.t.Errorf("locker hold %v did not end within 15s of SIGTERM", args)
		}
	}
	e.t.Cleanup(stop)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		e.t.Fatalf("locker hold %v printed %q, %v (stderr %q)", args, line, err, errb.String())
	}
	tok, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	if err != nil || tok <= 0 {
		e.t.Fatalf("locker hold %v printed %q, want the fencing token", args, line)
	}
	return holdProc{stop: stop, token: tok}
}

// TestLimit: --limit N takes one of the N permits of the key's semaphore
// (as consul lock -n): N holders at once, the next is told the key is
// held elsewhere (status 1), a different N is refused (125), and the
// key's mutex is another lock.
func TestLimit(t *testing.T) {
	e := newEnv(t)
	a := e.startHold("--limit", "2", "farm")
	b := e.startHold("--limit", "2", "farm")
	if b.token <= a.token {
		t.Errorf("the second permit's token %d is not above the first's %d", b.token, a.token)
	}
	r := e.run("run", "--wait", "0", "--limit", "2", "farm", "--", "true")
	r.want(t, 1, "--limit 2 with both permits held")
	if !strings.Contains(r.stderr, "held elsewhere") {
		t.Errorf("--limit 2 with both permits held: stderr %q, want it to say the lock is held elsewhere", r.stderr)
	}
	r = e.run("run", "--wait", "0", "--limit", "3", "farm", "--", "true")
	r.want(t, 125, "--limit 3 on a semaphore of 2")
	if !strings.Contains(r.stderr, "limit") {
		t.Errorf("--limit 3 on a semaphore of 2: stderr %q, want it to name the limit", r.stderr)
	}
	e.run("run", "--wait", "0", "farm", "--", "true").want(t, 0, "the mutex of a key whose semaphore is full")
	a.stop()
	r = e.run("run", "--wait", "0", "--limit", "2", "farm", "-c", `echo $LOCKER_TOKEN`)
	r.want(t, 0, "--limit 2 with a permit free")
	if tok, _ := strconv.ParseInt(strings.TrimSpace(r.stdout), 10, 64); tok <= b.token {
		t.Errorf("a permit granted again has token %d, not above %d", tok, b.token)
	}
	e.run("run", "--limit", "0", "farm", "--", "true").want(t, 125, "--limit 0")
	e.run("run", "--limit", "2", "--shared", "farm", "--", "true").want(t, 125, "--limit with --shared")
}

// TestSharedExclusive: --shared and --exclusive are the reader and the
// writer of the key's reader-writer lock (as flock -s and -x): readers
// share, a writer excludes them and is excluded by them.
func TestSharedExclusive(t *testing.T) {
	e := newEnv(t)
	r1 := e.startHold("--shared", "config")
	e.run("run", "--wait", "0", "--shared", "config", "--", "true").want(t, 0, "a second reader beside a reader")
	e.run("run", "--wait", "0", "--exclusive", "config", "--", "true").want(t, 1, "a writer while a reader holds")
	e.run("run", "--wait", "0", "-x", "config", "--", "true").want(t, 1, "-x while a reader holds")
	r1.stop()
	w := e.startHold("-x", "config")
	e.run("run", "--wait", "0", "-s", "config", "--", "true").want(t, 1, "a reader while a writer holds")
	r := e.run("run", "--wait", "0", "config", "-c", `echo $LOCKER_TOKEN`)
	r.want(t, 0, "the mutex of a key whose reader-writer lock is held")
	w.stop()
	e.run("run", "-s", "-x", "config", "--", "true").want(t, 125, "--shared with --exclusive")
}
