package cli_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-locker/locker/integration/testserver"
)

// statusEntry is one key of locker status -o json.
type statusEntry struct {
	Key     string `json:"key"`
	Held    bool   `json:"held"`
	Token   int64  `json:"token"`
	Owner   string `json:"owner"`
	Host    string `json:"host"`
	PID     int    `json:"pid"`
	Started string `json:"started"`
	Command string `json:"command"`
}

// TestStatusOwner: while locker run (or locker hold) holds a key, locker
// status shows who holds it, on every backend the command serves: the
// holder's host, the pid of the locker process, when it started, its
// command and its fencing token; the table shows the same. PostgreSQL keeps
// about 50 bytes of the description, so there the command may be cut.
func TestStatusOwner(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		url  func(t *testing.T) string
		cut  bool // the backend keeps only the start of the description
	}{
		{"SQLite", func(t *testing.T) string { return "sqlite://" + filepath.Join(t.TempDir(), "locks.db") }, false},
		{"PostgreSQL", func(t *testing.T) string { return testserver.Postgres(t).DSN() }, true},
		{"Redis", func(t *testing.T) string { return "redis://" + testserver.Redis(t).Addr() }, false},
		{"etcd", func(t *testing.T) string { return "etcd://" + testserver.Etcd(t).Addr() }, false},
		{"ZooKeeper", func(t *testing.T) string { return "zookeeper://" + testserver.ZooKeeper(t).Addr() }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			url := c.url(t)
			key := "cli/" + t.Name() + "/" + strconv.FormatInt(time.Now().UnixNano(), 36)
			before := time.Now().Add(-time.Second)
			holder := holdWith(t, "run", "--url", url, key, "--", "sh", "-c", "echo ready; exec sleep 60")
			want := statusEntry{Key: key, Held: true, Host: host, PID: holder.Process.Pid, Command: "sh -c 'echo ready; exec sleep 60'"}
			got := status(t, url, key)
			t.Logf("locker status: owner %q", got.Owner)
			checkStatus(t, got, want, before, c.cut)

			out := statusTable(t, url, key)
			for _, s := range []string{host, strconv.Itoa(holder.Process.Pid), strconv.FormatInt(got.Token, 10)} {
				if !strings.Contains(out, s) {
					t.Errorf("locker status (table) lacks %q:\n%s", s, out)
				}
			}
			if !c.cut && !strings.Contains(out, want.Command) {
				t.Errorf("locker status (table) lacks the command %q:\n%s", want.Command, out)
			}
			stop(t, holder)
			if got := status(t, url, key); got.Held || got.Owner != "" {
				t.Errorf("locker status after the holder ended: %+v; want not held, no owner", got)
			}

			if c.name == "SQLite" {
				hold := holdWith(t, "hold", "--url", url, key)
				want := statusEntry{Key: key, Held: true, Host: host, PID: hold.Process.Pid, Command: "locker hold " + key}
				checkStatus(t, status(t, url, key), want, before, false)
				stop(t, hold)
			}
		})
	}
}

func checkStatus(t *testing.T, got, want statusEntry, before time.Time, cut bool) {
	t.Helper()
	if !got.Held || got.Token <= 0 || got.Host != want.Host || got.PID != want.PID {
		t.Errorf("locker status = %+v; want held with a token, host %q, pid %d", got, want.Host, want.PID)
	}
	started, err := time.Parse(time.RFC3339, got.Started)
	if err != nil || started.Before(before.Truncate(time.Second)) || started.After(time.Now()) {
		t.Errorf("locker status: started %q (%v); want the holder's start, after %v", got.Started, err, before)
	}
	switch {
	case cut && (got.Command == "" || !strings.HasPrefix(want.Command, got.Command)):
		t.Errorf("locker status: command %q; want a start of %q", got.Command, want.Command)
	case !cut && got.Command != want.Command:
		t.Errorf("locker status: command %q; want %q", got.Command, want.Command)
	}
}

// holdWith starts locker with args and returns once it holds the key: run
// prints "ready" from its command, hold the token.
func holdWith(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	c := exec.Command(binary, args...)
	c.Env = append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir())
	stdout, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.Stderr = os.Stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil {
		t.Fatalf("locker %v printed %q, %v", args, line, err)
	}
	return c
}

// stop ends a holder with SIGTERM, which releases its lock.
func stop(t *testing.T, c *exec.Cmd) {
	t.Helper()
	if err := c.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = c.Wait() // run exits with its command's status after the signal
}

func statusOutput(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, binary, append([]string{"status"}, args...)...)
	c.Env = append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir())
	c.Stderr = os.Stderr
	out, err := c.Output()
	if err != nil {
		t.Fatalf("locker status %v: %v", args, err)
	}
	return string(out)
}

func status(t *testing.T, url, key string) statusEntry {
	t.Helper()
	var got []statusEntry
	out := statusOutput(t, "--url", url, "-o", "json", key)
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 1 {
		t.Fatalf("locker status -o json: %q: %v", out, err)
	}
	return got[0]
}

func statusTable(t *testing.T, url, key string) string {
	t.Helper()
	return statusOutput(t, "--url", url, key)
}
