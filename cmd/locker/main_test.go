package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-locker/locker/sqltable"
)

// The tests drive the built binary as a user would: real child processes,
// their exit statuses, environment and signals, on an SQLite lock database
// in a temporary directory (the default backend, with no server).

var binary string

// locker's own exit statuses (cmd/locker/internal/cli).
const (
	exitLost        = 124
	exitFailure     = 125
	exitCannotStart = 126
	exitNotFound    = 127
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "locker-cmd-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Both binaries, side by side as go install puts them: locker runs
	// locker-full for every URL but sqlite: and for bench.
	binary = filepath.Join(dir, "locker")
	for _, b := range [][2]string{{binary, "."}, {filepath.Join(dir, "locker-full"), "./locker-full"}} {
		build := exec.Command("go", "build", "-race", "-o", b[0], b[1])
		build.Stderr = os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building", b[1], err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env gives each test its own lock database and cache directory.
type env struct {
	t    *testing.T
	db   string // path of the SQLite file
	url  string
	vars []string
}

func newEnv(t *testing.T) *env {
	dir := t.TempDir()
	db := filepath.Join(dir, "locks.db")
	return &env{t: t, db: db, url: "sqlite://" + db,
		vars: []string{"LOCKER_URL=sqlite://" + db, "XDG_CACHE_HOME=" + filepath.Join(dir, "cache"), "HOME=" + dir}}
}

func (e *env) cmd(args ...string) *exec.Cmd {
	c := exec.Command(binary, args...)
	c.Env = append(os.Environ(), e.vars...)
	return c
}

type result struct {
	code           int
	stdout, stderr string
}

func (e *env) run(args ...string) result {
	e.t.Helper()
	c := e.cmd(args...)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		e.t.Fatalf("running locker %v: %v", args, err)
	}
	return result{c.ProcessState.ExitCode(), out.String(), errb.String()}
}

func (r result) want(t *testing.T, code int, what string) {
	t.Helper()
	if r.code != code {
		t.Errorf("%s: exit status %d, want %d (stdout %q, stderr %q)", what, r.code, code, r.stdout, r.stderr)
	}
	if strings.Contains(r.stderr, "goroutine ") || strings.Contains(r.stderr, "panic:") {
		t.Errorf("%s: a Go stack trace on stderr: %s", what, r.stderr)
	}
}

func TestRunPassesExitStatusAndEnv(t *testing.T) {
	e := newEnv(t)
	r := e.run("run", "demo", "--", "sh", "-c", `echo "$LOCKER_KEY $LOCKER_TOKEN"; exit 3`)
	r.want(t, 3, "command exiting 3")
	f := strings.Fields(r.stdout)
	if len(f) != 2 || f[0] != "demo" {
		t.Fatalf("command saw LOCKER_KEY, LOCKER_TOKEN = %q", r.stdout)
	}
	tok1, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || tok1 <= 0 {
		t.Fatalf("LOCKER_TOKEN %q is not a positive integer", f[1])
	}
	r = e.run("run", "demo", "-c", `echo $LOCKER_TOKEN`)
	r.want(t, 0, "shell command")
	tok2, _ := strconv.ParseInt(strings.TrimSpace(r.stdout), 10, 64)
	if tok2 <= tok1 {
		t.Errorf("second holder's token %d not above the first's %d", tok2, tok1)
	}
	// The lock is free again after each run.
	e.run("run", "--wait", "0", "demo", "--", "true").want(t, 0, "--wait 0 on a released key")
}

func TestRunErrors(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"run", "k", "--", "/nonexistent/cmd"}, exitNotFound, "not found"},
		{[]string{"run", "k", "--", "/dev/null"}, exitCannotStart, "/dev/null"},
		{[]string{"run", "--url", "redis://:s3cret@127.0.0.1:1/?bogus=1", "k", "--", "true"}, exitFailure, "bogus"},
		{[]string{"run", "--url", "nosuch://x", "k", "--", "true"}, exitFailure, "nosuch"},
		{[]string{"run", "--ttl", "-1s", "k", "--", "true"}, exitFailure, "--ttl"},
		{[]string{"run", "--wait", "soon", "k", "--", "true"}, exitFailure, "soon"},
		{[]string{"run", "--conflict-exit-code", "300", "k", "--", "true"}, exitFailure, "300"},
		{[]string{"run", "k"}, exitFailure, "missing COMMAND"},
		{[]string{"run"}, exitFailure, "missing KEY"},
		{[]string{"run", "k", "-c", "true", "--", "echo"}, exitFailure, "both"},
		{[]string{"run", "", "--", "true"}, exitFailure, "key"},
		{[]string{"nosuchcommand"}, exitFailure, "unknown command"},
	} {
		r := e.run(c.args...)
		r.want(t, c.code, strings.Join(c.args, " "))
		if !strings.Contains(r.stderr, c.msg) {
			t.Errorf("locker %v: stderr %q does not mention %q", c.args, r.stderr, c.msg)
		}
		if strings.Contains(r.stderr, "s3cret") {
			t.Errorf("locker %v: stderr echoes the password: %q", c.args, r.stderr)
		}
		if strings.Count(strings.TrimSpace(r.stderr), "\n") > 1 {
			t.Errorf("locker %v: want one clear line (and a usage hint at most), got %q", c.args, r.stderr)
		}
	}
}

// holding starts "locker run KEY" with a command that prints "ready" once it
// holds the lock, then waits for stdin to close (or its own -c script), and
// returns it with its stdout reader once ready.
func (e *env) holding(key string, extra ...string) (*exec.Cmd, *bufio.Reader, io.WriteCloser) {
	e.t.Helper()
	args := append([]string{"run"}, extra...)
	args = append(args, key, "--", "sh", "-c", `trap 'echo got-TERM; exit 7' TERM; echo ready; while :; do sleep 0.05; done`)
	c := e.cmd(args...)
	stdout, err := c.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	stdin, _ := c.StdinPipe()
	c.Stderr = os.Stderr
	if err := c.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		// SIGTERM reaches the command through locker; SIGKILL after a
		// while, which the kernel passes on to the command (Pdeathsig).
		_ = c.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = c.Process.Kill()
			<-done
		}
	})
	rd := bufio.NewReader(stdout)
	line, err := rd.ReadString('\n')
	if err != nil || line != "ready\n" {
		e.t.Fatalf("holder: %q, %v", line, err)
	}
	return c, rd, stdin
}

func TestRunConflict(t *testing.T) {
	e := newEnv(t)
	holder, _, _ := e.holding("busy")
	r := e.run("run", "--wait", "0", "busy", "--", "echo", "ran")
	r.want(t, 1, "--wait 0 on a held key")
	if r.stdout != "" || !strings.Contains(r.stderr, "held elsewhere") {
		t.Errorf("--wait 0 on a held key: stdout %q stderr %q", r.stdout, r.stderr)
	}
	r = e.run("run", "--wait", "200ms", "-E", "9", "-q", "busy", "--", "echo", "ran")
	r.want(t, 9, "--wait 200ms -E 9 on a held key")
	if r.stdout != "" || r.stderr != "" {
		t.Errorf("-q conflict: stdout %q stderr %q, want nothing", r.stdout, r.stderr)
	}
	// The holder is untouched by the failed tries.
	_ = holder.Process.Signal(syscall.SIGTERM)
	err := holder.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Errorf("holder after SIGTERM: %v, want the command's status 7 (the signal passed on)", err)
	}
	e.run("run", "--wait", "0", "busy", "--", "true").want(t, 0, "key after the holder ended")
}

func TestRunForwardsSignals(t *testing.T) {
	e := newEnv(t)
	holder, rd, _ := e.holding("sig")
	if err := holder.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	line, _ := rd.ReadString('\n')
	if line != "got-TERM\n" {
		t.Errorf("command printed %q after SIGTERM to locker, want got-TERM", line)
	}
	err := holder.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Errorf("locker after SIGTERM: %v, want the command's exit status 7", err)
	}
}

func TestRunSignalWhileWaiting(t *testing.T) {
	e := newEnv(t)
	e.holding("w")
	waiter := e.cmd("run", "-v", "w", "--", "echo", "must-not-run")
	var out bytes.Buffer
	waiter.Stdout = &out
	stderr, _ := waiter.StderrPipe()
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(stderr)
	// -v says when locker starts waiting; its signal handling is in place
	// by then.
	if line, err := rd.ReadString('\n'); !strings.Contains(line, "acquiring the lock") {
		t.Fatalf("waiter said %q, %v", line, err)
	}
	_ = waiter.Process.Signal(syscall.SIGINT)
	rest, _ := io.ReadAll(rd)
	errb := bytes.NewBuffer(rest)
	err := waiter.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 128+int(syscall.SIGINT) {
		t.Errorf("waiting locker after SIGINT: %v, want status %d", err, 128+int(syscall.SIGINT))
	}
	if out.Len() != 0 || !strings.Contains(errb.String(), "nothing was run") {
		t.Errorf("stdout %q, stderr %q", out.String(), errb.String())
	}
}

// TestRunLossKillsCommand deletes the lock's row from outside while the
// command runs: the renewal finds it gone, and locker must end the command
// and exit 124.
func TestRunLossKillsCommand(t *testing.T) {
	e := newEnv(t)
	holder, rd, _ := e.holding("lose", "--ttl", "1s", "--kill-after", "2s")
	db, err := sql.Open("sqlite", e.db+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	res, err := db.ExecContext(context.Background(), `DELETE FROM "`+sqltable.DefaultTable+`" WHERE 1=1`)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("deleted %d lock rows, want 1", n)
	}
	line, _ := rd.ReadString('\n')
	if line != "got-TERM\n" {
		t.Errorf("command printed %q after the loss, want got-TERM", line)
	}
	err = holder.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitLost {
		t.Errorf("locker after losing the lock: %v, want status %d", err, exitLost)
	}
}

// TestRunNoOverlap: several locker run on one key never run their commands
// at the same time.
func TestRunNoOverlap(t *testing.T) {
	e := newEnv(t)
	marker := filepath.Join(t.TempDir(), "inside")
	script := `if [ -e "$M" ]; then echo OVERLAP; fi; touch "$M"; sleep 0.05; rm "$M"; echo done`
	const n = 4
	var wg sync.WaitGroup
	results := make([]result, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := e.cmd("run", "shared", "-c", script)
			c.Env = append(c.Env, "M="+marker)
			var out, errb bytes.Buffer
			c.Stdout, c.Stderr = &out, &errb
			_ = c.Run()
			results[i] = result{c.ProcessState.ExitCode(), out.String(), errb.String()}
		}()
	}
	wg.Wait()
	for i, r := range results {
		r.want(t, 0, fmt.Sprintf("runner %d", i))
		if r.stdout != "done\n" {
			t.Errorf("runner %d printed %q, want done (OVERLAP means two held the lock at once)", i, r.stdout)
		}
	}
}

func TestStatus(t *testing.T) {
	e := newEnv(t)
	e.holding("held-key")
	r := e.run("status", "-o", "json", "held-key", "free-key")
	r.want(t, 0, "status")
	for _, want := range []string{`"key": "held-key"`, `"held": true`, `"key": "free-key"`, `"held": false`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status output lacks %s: %s", want, r.stdout)
		}
	}
}

// TestStatusOwnerFlag: status shows who holds a key: by default the host,
// pid and command line of the locker run holding it; --owner records
// something else instead (a command line can carry what others who read
// the backend should not see); a description WithOwner refuses is a usage
// error.
func TestStatusOwnerFlag(t *testing.T) {
	e := newEnv(t)
	e.holding("default-owner")
	e.holding("given-owner", "--owner", "nightly batch 7")
	r := e.run("status", "-o", "json", "default-owner", "given-owner")
	r.want(t, 0, "status")
	for _, want := range []string{`"owner": "host=`, `cmd=sh -c`, `"owner": "nightly batch 7"`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status output lacks %s: %s", want, r.stdout)
		}
	}
	_, given, _ := strings.Cut(r.stdout, `"key": "given-owner"`)
	if strings.Contains(given, "while :") {
		t.Errorf("the command line of the --owner holder was recorded: %s", given)
	}
	r = e.run("run", "--owner", "two\nlines", "k", "--", "true")
	r.want(t, 125, "run --owner with a newline")
	if !strings.Contains(r.stderr, "--owner") || !strings.Contains(r.stderr, "control character") {
		t.Errorf("run --owner with a newline: stderr %q, want it to name --owner and the control character", r.stderr)
	}
}
