package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The command's whole process tree ends with the lock: a grandchild of the
// command must be gone before another holder's command starts, when locker
// is killed and when the lock is lost.

// treeScript starts a grandchild (sleep, which ignores SIGTERM as its
// parent does), prints its pid and waits.
const treeScript = `trap "" TERM; sleep 300 & echo "gc:$!"; wait`

// checkScript, run by the next holder, prints "gone" when process $GC no
// longer runs (gone, or a zombie), else "alive:<state>".
const checkScript = `st=$(cut -d" " -f3 /proc/$GC/stat 2>/dev/null); if [ -z "$st" ] || [ "$st" = Z ]; then echo gone; else echo "alive:$st"; fi`

// startTree starts "locker run KEY" with treeScript and returns it, its
// stderr reader and the grandchild's pid.
func startTree(t *testing.T, e *env, key string, extra ...string) (*exec.Cmd, *bufio.Reader, int) {
	t.Helper()
	args := append([]string{"run", "--ttl", "1s"}, extra...)
	args = append(args, key, "--", "sh", "-c", treeScript)
	c := e.cmd(args...)
	stdout, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := c.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	gc, perr := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(line), "gc:"))
	if err != nil || perr != nil {
		t.Fatalf("holder printed %q, %v", line, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(gc, syscall.SIGKILL) })
	return c, bufio.NewReader(stderr), gc
}

// nextHolder starts a locker run that waits for key and reports whether
// process gc still runs when its command starts.
func nextHolder(t *testing.T, e *env, key string, gc int) *exec.Cmd {
	c := e.cmd("run", "--wait", "30s", key, "--", "sh", "-c", checkScript)
	c.Env = append(c.Env, "GC="+strconv.Itoa(gc))
	return c
}

func TestLockerKilledEndsTree(t *testing.T) {
	e := newEnv(t)
	holder, _, gc := startTree(t, e, "killed")
	if err := holder.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = holder.Wait()
	out, err := nextHolder(t, e, "killed", gc).Output()
	if err != nil {
		t.Fatalf("next holder: %v", err)
	}
	if got := strings.TrimSpace(string(out)); got != "gone" {
		t.Errorf("when the next holder's command started, the grandchild of the SIGKILLed locker's command was %s, want gone", got)
	}
}

// TestLossEndsTree cuts the holder off from its lock database (an exclusive
// transaction blocks its renewals) until it reports the loss, then lets the
// next holder in: the lost holder's grandchild, which ignores SIGTERM, must
// be gone when the next holder's command starts (the next holder gets the
// lock as soon as the lost lease has run out).
func TestLossEndsTree(t *testing.T) {
	e := newEnv(t)
	holder, stderr, gc := startTree(t, e, "lost")
	db, err := sql.Open("sqlite", e.db+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN EXCLUSIVE"); err != nil {
		t.Fatal(err)
	}
	lost := make(chan string, 1)
	go func() {
		for {
			line, err := stderr.ReadString('\n')
			if strings.Contains(line, "lost the lock") || err != nil {
				lost <- line
				return
			}
		}
	}()
	select {
	case line := <-lost:
		if !strings.Contains(line, "lost the lock") {
			t.Fatalf("holder's stderr ended without reporting the loss: %q", line)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the holder cut off from its database did not report the loss within 20s")
	}
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	next := nextHolder(t, e, "lost", gc)
	out, err := next.Output()
	if err != nil {
		t.Fatalf("next holder: %v", err)
	}
	if got := strings.TrimSpace(string(out)); got != "gone" {
		t.Errorf("when the next holder's command started, the grandchild of the lost holder's command was %s, want gone", got)
	}
	err = holder.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitLost {
		t.Errorf("lost holder: %v, want status %d", err, exitLost)
	}
}

// TestQuitReleases: SIGQUIT is passed on to the command like SIGTERM, and
// the lock is released (no goroutine dump, no lock left held).
func TestQuitReleases(t *testing.T) {
	e := newEnv(t)
	c := e.cmd("run", "quit", "--", "sh", "-c", `trap 'echo got-QUIT; exit 9' QUIT; echo ready; while :; do sleep 0.05; done`)
	stdout, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb strings.Builder
	c.Stderr = &errb
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Process.Kill() })
	rd := bufio.NewReader(stdout)
	if line, err := rd.ReadString('\n'); line != "ready\n" {
		t.Fatalf("holder printed %q, %v", line, err)
	}
	if err := c.Process.Signal(syscall.SIGQUIT); err != nil {
		t.Fatal(err)
	}
	if line, _ := rd.ReadString('\n'); line != "got-QUIT\n" {
		t.Errorf("command printed %q after SIGQUIT to locker, want got-QUIT", line)
	}
	err = waitExit(c, 10*time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 9 {
		t.Errorf("locker after SIGQUIT: %v, want the command's status 9", err)
	}
	if strings.Contains(errb.String(), "goroutine ") {
		t.Errorf("locker printed a goroutine dump on SIGQUIT: %.300s", errb.String())
	}
	e.run("run", "--wait", "0", "quit", "--", "true").want(t, 0, "--wait 0 after SIGQUIT")
}
