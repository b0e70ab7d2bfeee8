package main

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestOutageIsNotConflict: against a backend that does not answer (nothing
// listens on 127.0.0.1:1), every subcommand ends within its --timeout with
// status 125 and a line that says the backend did not answer; never with
// the conflict status 1, which would make a cron job skip its run silently.
func TestOutageIsNotConflict(t *testing.T) {
	for _, url := range []string{"etcd://127.0.0.1:1", "zookeeper://127.0.0.1:1"} {
		for _, c := range []struct {
			name string
			args []string
			// bound is how long the run may take: --timeout for the
			// connection and each attempt, and the wait.
			bound time.Duration
		}{
			{"wait0", []string{"run", "--timeout", "2s", "--wait", "0", "k", "--", "echo", "ran"}, 2 * 2 * time.Second},
			{"wait3s", []string{"run", "--timeout", "2s", "--wait", "3s", "k", "--", "echo", "ran"}, 2*2*time.Second + 3*time.Second},
			{"status", []string{"status", "--timeout", "2s", "k"}, 2 * 2 * time.Second},
			{"hold", []string{"hold", "--timeout", "2s", "--wait", "0", "k"}, 2 * 2 * time.Second},
			// The default --timeout (10s) bounds a run too.
			{"wait3s-default", []string{"run", "--wait", "3s", "k", "--", "echo", "ran"}, 2*10*time.Second + 3*time.Second},
		} {
			t.Run(strings.SplitN(url, ":", 2)[0]+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t)
				args := append([]string{}, c.args...)
				args = append(args[:1], append([]string{"--url", url}, args[1:]...)...)
				ctx, cancel := context.WithTimeout(context.Background(), c.bound+5*time.Second)
				defer cancel()
				cmd := exec.CommandContext(ctx, binary, args...)
				cmd.Env = e.cmd().Env
				var out, errb bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &errb
				start := time.Now()
				err := cmd.Run()
				took := time.Since(start)
				if ctx.Err() != nil {
					t.Fatalf("locker %v did not end within %v (killed); stderr %q", args, c.bound+5*time.Second, errb.String())
				}
				var ee *exec.ExitError
				code := 0
				if errors.As(err, &ee) {
					code = ee.ExitCode()
				}
				if code != exitFailure {
					t.Errorf("locker %v: status %d after %v, want %d (an outage is not a conflict); stderr %q", args, code, took.Round(time.Millisecond), exitFailure, errb.String())
				}
				if took > c.bound+time.Second {
					t.Errorf("locker %v took %v, want at most %v", args, took.Round(time.Millisecond), c.bound)
				}
				msg := errb.String()
				if !strings.Contains(msg, "127.0.0.1:1") || !strings.Contains(msg, "did not answer") || strings.Contains(msg, "held elsewhere") {
					t.Errorf("locker %v: stderr %q; want one line saying the backend at 127.0.0.1:1 did not answer", args, msg)
				}
				if strings.Count(strings.TrimSpace(msg), "\n") > 0 {
					t.Errorf("locker %v: stderr has several lines: %q", args, msg)
				}
				if out.Len() != 0 {
					t.Errorf("locker %v: stdout %q, want nothing (the command must not run)", args, out.String())
				}
			})
		}
	}
}
