package redlock_test

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/redis/redlock"
)

// requestGoroutines counts the goroutines running a request of a Redlock
// round (fanout's per-node goroutines).
func requestGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "redis/redlock.fanout[") {
			n++
		}
	}
	return n
}

// With clients the caller owns (New), Close interrupts a call whose request
// hangs on a node that stopped answering (the conformance suite requires
// it to return promptly), but it cannot end the request itself: go-redis
// has no abort, and the connection is the caller's. The request's goroutine
// outlives Close until the node timeout, which reaches the socket with
// ContextTimeoutEnabled, and the clean-up of the round's partial grants
// (one more node timeout at most) after it: this checks that bound, and
// shows the goroutines that outlive Close. The Locker interface says none
// may; ending them would take closing the caller's connections, or a Close
// that waits for them, which the suite's Close/WhileInFlight forbids.
// Locker.Close documents the limit.
func TestCloseWithRequestInFlight(t *testing.T) {
	addrs := nodeAddrs(t, 3)
	c := newLocker(t, addrs, redlock.WithDefaultTTL(3*time.Second)) // node timeout 300ms
	key := uniqueKey(t)
	warm(t, c.l, key)
	c.pxs[0].Blackhole(t)
	defer c.pxs[0].Heal(t)
	ctx := testCtx(t, 30*time.Second)
	res := make(chan error, 1)
	go func() {
		h, err := c.l.Acquire(ctx, key)
		if err == nil {
			err = errors.New("acquired")
			_ = h
		}
		res <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for requestGoroutines() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no request in flight")
		}
		time.Sleep(time.Millisecond) // looking at the goroutines: no signal to wait on
	}
	start := time.Now()
	if err := c.l.Close(); err != nil {
		t.Logf("Close: %v", err)
	}
	closed := time.Since(start)
	left := requestGoroutines()
	if err := <-res; err != nil && !errors.Is(err, locker.ErrClosed) && err.Error() != "acquired" {
		t.Errorf("Acquire in flight at Close: %v", err)
	}
	for requestGoroutines() > 0 {
		if time.Since(start) > 300*time.Millisecond+5*time.Second {
			t.Fatalf("a request's goroutine still runs %v after Close, beyond its node timeout of 300ms", time.Since(start))
		}
		time.Sleep(5 * time.Millisecond) // looking at the goroutines: no signal to wait on
	}
	t.Logf("Close returned after %v with %d requests in flight; the last ended %v after Close began", closed, left, time.Since(start))
}
