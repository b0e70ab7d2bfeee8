// Package cli_test runs the locker command (cmd/locker and its sibling
// cmd/locker/locker-full, built from this checkout) against real servers: what its exit status says about a key
// held elsewhere and about a backend that stopped answering.
package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-locker/locker/integration/testserver"
)

var binary string

func TestMain(m *testing.M) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	dir, err := os.MkdirTemp("", "locker-cli-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// locker runs locker-full, beside it, for every URL but sqlite:.
	binary = filepath.Join(dir, "locker")
	for _, b := range [][2]string{{binary, "./cmd/locker"}, {filepath.Join(dir, "locker-full"), "./cmd/locker/locker-full"}} {
		build := exec.Command("go", "build", "-race", "-o", b[0], b[1])
		build.Dir, build.Stderr = root, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building", b[1], err)
			os.Exit(1)
		}
	}
	defer os.RemoveAll(dir)
	testserver.Main(m)
}

type result struct {
	code   int
	stderr string
	took   time.Duration
}

func run(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, binary, args...)
	c.Env = append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir())
	var errb bytes.Buffer
	c.Stderr = &errb
	start := time.Now()
	err := c.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("locker %v: %v", args, err)
	}
	return result{c.ProcessState.ExitCode(), errb.String(), time.Since(start)}
}

// TestHeldElsewhere: on etcd and ZooKeeper (whose clients wait for an
// unreachable server rather than fail), a key that locker hold holds makes
// locker run exit with the conflict status, 1, and a line that says so;
// once hold has released it, the key is free; with the server paused, the
// same runs exit 125 saying the backend did not answer, within --timeout:
// an outage never looks like a conflict.
func TestHeldElsewhere(t *testing.T) {
	for _, c := range []struct {
		name string
		srv  func(testing.TB) *testserver.Server
		url  func(*testserver.Server) string
	}{
		{"etcd", testserver.NewEtcd, func(s *testserver.Server) string { return "etcd://" + s.Addr() }},
		{"zookeeper", testserver.NewZooKeeper, func(s *testserver.Server) string { return "zookeeper://" + s.Addr() }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := c.srv(t)
			url := c.url(s)
			key := "cli/" + t.Name()

			hold := exec.Command(binary, "hold", "--url", url, "--ttl", "60s", key)
			hold.Env = append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir())
			stdout, err := hold.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			hold.Stderr = os.Stderr
			if err := hold.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = hold.Process.Kill(); _ = hold.Wait() })
			if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil {
				t.Fatalf("locker hold printed %q, %v", line, err)
			}

			for _, wait := range []string{"0", "2s"} {
				r := run(t, "run", "--url", url, "--wait", wait, key, "--", "true")
				if r.code != 1 || !strings.Contains(r.stderr, "held elsewhere") {
					t.Errorf("--wait %s on a key locker hold holds: status %d, stderr %q; want 1 and \"held elsewhere\"", wait, r.code, r.stderr)
				}
			}

			if err := hold.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := hold.Wait(); err != nil {
				t.Errorf("locker hold after SIGTERM: %v, want status 0", err)
			}
			if r := run(t, "run", "--url", url, "--wait", "0", key, "--", "true"); r.code != 0 {
				t.Errorf("--wait 0 after locker hold ended: status %d, stderr %q", r.code, r.stderr)
			}
			if s.CanControl() {
				s.Pause(t)
				for _, args := range [][]string{
					{"run", "--url", url, "--timeout", "2s", "--wait", "0", key, "--", "true"},
					{"run", "--url", url, "--timeout", "2s", "--wait", "3s", key, "--", "true"},
					{"status", "--url", url, "--timeout", "2s", key},
				} {
					r := run(t, args...)
					if r.code != 125 || !strings.Contains(r.stderr, "did not answer") {
						t.Errorf("locker %v with the server paused: status %d after %v, stderr %q; want 125 and \"did not answer\"", args, r.code, r.took.Round(time.Millisecond), r.stderr)
					}
					if r.took > 2*2*time.Second+3*time.Second+time.Second {
						t.Errorf("locker %v with the server paused took %v", args, r.took.Round(time.Millisecond))
					}
				}
				s.Resume(t)
			} else {
				t.Log("server not under the test's control (an address from the environment): the outage half is skipped")
			}

		})
	}
}
