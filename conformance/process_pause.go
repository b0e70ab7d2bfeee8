package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// pausedHolder: a child process that holds a key is paused (SIGSTOP) for
// longer than its lease, as a long GC pause, a VM migration or a swapped-out
// process is; meanwhile this process tries to take the key. The child is
// resumed and looks at its handle at once, before any timer of its own has
// had a chance to run. If this process got the key, the child's first look
// must already say lost (Done closed, Err wrapping ErrLost): a holder that
// checks Err before a write must not see "held" while another holds. If this
// process did not get the key (a session backend keeps the session of a
// paused process), the child must still hold it, and this process must
// still be refused.
func (s *suite) pausedHolder(t *testing.T, ctx context.Context) {
	s.needProcesses(t)
	if !canPause {
		t.Skip("conformance: pausing a process (SIGSTOP) is not supported on this OS")
	}
	l := s.newLocker(t)
	k := key(t, "")
	child := s.startChild(t, k)
	if _, err := fmt.Fprintln(child.stdin, childWatch); err != nil {
		t.Fatalf("tell the child process to watch for a pause: %v", err)
	}
	child.expect(t, childWatching, time.Minute)
	pauseProcess(t, child.cmd.Process, true)
	paused := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			pauseProcess(t, child.cmd.Process, false)
		}
	}
	defer resume()
	wctx, cancel := context.WithTimeout(ctx, s.h.ExpiryBound)
	h, err := l.Acquire(wctx, k)
	cancel()
	switch {
	case err == nil:
		t.Logf("key held here %v after the child holding it was paused", time.Since(paused).Round(time.Millisecond))
		if h.Token() <= child.token {
			t.Errorf("token %d here is not greater than the paused child's %d", h.Token(), child.token)
		}
	case errors.Is(err, context.DeadlineExceeded):
		t.Logf("key still held by the child %v after it was paused (its backend keeps a paused holder's session)", time.Since(paused).Round(time.Millisecond))
	default:
		t.Fatalf("Acquire while the holder is paused: %v", err)
	}
	// Keep the pause at least a TTL long, so that the child, which looks
	// for a gap of half a TTL, surely sees it.
	if rest := time.Until(paused.Add(s.h.TTL)); rest > 0 {
		time.Sleep(rest)
	}
	resume()
	got := child.expect(t, childResumed, time.Minute)
	t.Logf("child, at its first look after the pause: %s", got)
	lost := strings.Contains(got, "lost=true") && strings.Contains(got, "done=true")
	if h != nil {
		if !lost {
			t.Errorf("a holder resumed from a pause past its lease, looked at its handle while another client held the key, and was not told it was lost (%s): Err and Done must answer from the clock, not only from a timer that has yet to fire", got)
		}
		mustRelease(t, ctx, h)
	} else {
		if strings.Contains(got, "lost=true") || strings.Contains(got, "done=true") {
			t.Logf("the child gave its lock up after the pause, though nobody took it: allowed")
		} else {
			mustNotTry(t, ctx, l, k, "the child process resumed from a pause and still holds it")
		}
	}
	child.release(t)
}

// expect waits at most d for a line from the child that starts with prefix,
// and returns the rest of it.
func (c *childHolder) expect(t *testing.T, prefix string, d time.Duration) string {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case line := <-c.lines:
			if rest, ok := strings.CutPrefix(line, prefix); ok {
				return rest
			}
		case err := <-c.exit:
			c.exit <- err
			t.Fatalf("child process ended (%v) before it printed %q", err, prefix)
		case <-timer.C:
			t.Fatalf("child process did not print %q within %v", prefix, d)
		}
	}
}
