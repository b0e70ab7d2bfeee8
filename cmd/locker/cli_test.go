package main

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The conventions of a command line tool: --version, usage on no
// arguments, a KEY before "--", and no password in the child's environment.

func TestVersion(t *testing.T) {
	e := newEnv(t)
	r := e.run("--version")
	r.want(t, 0, "locker --version")
	if !strings.HasPrefix(r.stdout, "locker ") || strings.TrimSpace(r.stdout) == "locker" {
		t.Errorf("locker --version printed %q, want \"locker <version>\"", r.stdout)
	}
}

func TestUsage(t *testing.T) {
	e := newEnv(t)
	r := e.run()
	r.want(t, exitFailure, "locker with no arguments")
	if !strings.Contains(r.stderr, "Usage:") || r.stdout != "" {
		t.Errorf("locker with no arguments: stdout %q, stderr %q; want the usage on stderr", r.stdout, r.stderr)
	}
	// No KEY before "--": "echo" is the command, not a key.
	r = e.run("run", "--", "echo", "hi")
	r.want(t, exitFailure, "locker run -- echo hi")
	if !strings.Contains(r.stderr, "missing KEY") || r.stdout != "" {
		t.Errorf("locker run -- echo hi: stdout %q, stderr %q; want a usage error naming the missing KEY", r.stdout, r.stderr)
	}
	r = e.run("hold")
	r.want(t, exitFailure, "locker hold")
	if !strings.Contains(r.stderr, "missing KEY") {
		t.Errorf("locker hold: stderr %q; want a usage error naming the missing KEY", r.stderr)
	}
}

// TestChildEnvHasNoPassword: a LOCKER_URL with a password reaches the
// command with the password replaced by a placeholder, and a locker that is
// given such a URL says what happened instead of failing to log in.
func TestChildEnvHasNoPassword(t *testing.T) {
	e := newEnv(t)
	for _, secretURL := range []string{
		"redis://:s3cret@127.0.0.1:6379/0",
		"postgres://locker@127.0.0.1:5432/db?password=s3cret",
	} {
		c := e.cmd("run", "--url", e.url, "k", "--", "sh", "-c", `echo "$LOCKER_URL"`)
		c.Env = append(c.Env, "LOCKER_URL="+secretURL)
		out, err := c.Output()
		if err != nil {
			t.Fatalf("locker run with LOCKER_URL=%s: %v", secretURL, err)
		}
		got := strings.TrimSpace(string(out))
		if strings.Contains(got, "s3cret") {
			t.Errorf("the command's LOCKER_URL is %q: it carries the password", got)
		}
		if !strings.Contains(got, "xxxxx") || !strings.Contains(got, "127.0.0.1") {
			t.Errorf("the command's LOCKER_URL is %q, want the URL with its password as xxxxx", got)
		}
		// A nested locker on the redacted URL says why it cannot log in.
		nested := e.cmd("status", "k")
		nested.Env = append(nested.Env, "LOCKER_URL="+got)
		var errb strings.Builder
		nested.Stderr = &errb
		err = nested.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitFailure || !strings.Contains(errb.String(), "placeholder") {
			t.Errorf("locker status on the redacted URL %q: %v, stderr %q; want status %d and a line about the placeholder", got, err, errb.String(), exitFailure)
		}
	}
}

// TestHold: locker hold prints the token, keeps the lock until SIGTERM,
// then releases it and exits 0.
func TestHold(t *testing.T) {
	e := newEnv(t)
	c := e.cmd("hold", "held")
	stdout, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb strings.Builder
	c.Stderr = &errb
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("locker hold printed %q, %v (stderr %q)", line, err, errb.String())
	}
	tok, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	if err != nil || tok <= 0 {
		t.Fatalf("locker hold printed %q, want the fencing token", line)
	}
	e.run("run", "--wait", "0", "held", "--", "true").want(t, 1, "--wait 0 on a key locker hold holds")
	if err := c.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("locker hold after SIGTERM: %v (stderr %q), want status 0", err, errb.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("locker hold did not end within 15s of SIGTERM")
	}
	r := e.run("run", "--wait", "0", "held", "-c", `echo $LOCKER_TOKEN`)
	r.want(t, 0, "--wait 0 after locker hold ended")
	if next, _ := strconv.ParseInt(strings.TrimSpace(r.stdout), 10, 64); next <= tok {
		t.Errorf("the next holder's token %d is not above locker hold's %d", next, tok)
	}
}

// TestFullMissing: without locker-full beside it or in $PATH, locker says
// how to install it for bench and the URLs of every backend but SQLite
// instead of failing obscurely, and still runs on SQLite.
func TestFullMissing(t *testing.T) {
	e := newEnv(t)
	alone := filepath.Join(t.TempDir(), "locker")
	data, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(alone, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cases := [][]string{{"bench"}}
	for _, s := range fullSchemes {
		cases = append(cases, []string{"status", "--url", s + "://127.0.0.1:1/x", "k"}, []string{"run", "--url", strings.ToUpper(s) + "://127.0.0.1:1/x", "k", "--", "true"})
	}
	for _, args := range cases {
		c := exec.Command(alone, args...)
		c.Env = append(e.cmd().Env, "PATH=/usr/bin:/bin")
		var errb strings.Builder
		c.Stderr = &errb
		err := c.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitFailure || !strings.Contains(errb.String(), "go install github.com/go-locker/locker/cmd/locker/...@latest") {
			t.Errorf("locker %v without locker-full: %v, stderr %q; want status %d and how to install it", args, err, errb.String(), exitFailure)
		}
	}
	c := exec.Command(alone, "run", "k", "--", "true")
	c.Env = append(e.cmd().Env, "PATH=/usr/bin:/bin")
	if out, err := c.CombinedOutput(); err != nil {
		t.Errorf("locker run on the default SQLite without locker-full: %v, output %q", err, out)
	}
}
