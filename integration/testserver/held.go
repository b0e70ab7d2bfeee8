package testserver

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// TakeKeys takes n new keys on l, one after the other (so that their
// renewals come due together, in one batch), each with a lease of ttl, and
// releases them when the test ends.
func TakeKeys(t testing.TB, l locker.Locker, name string, n int, ttl time.Duration) []locker.Handle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := fmt.Sprintf("%s/%d/", name, time.Now().UnixNano())
	hs := make([]locker.Handle, 0, n)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, h := range hs {
			_ = h.Release(ctx)
		}
	})
	for i := range n {
		h, err := l.TryAcquire(ctx, fmt.Sprintf("%s%d", base, i), locker.WithTTL(ttl))
		if err != nil {
			t.Fatalf("TakeKeys: key %d: %v", i, err)
		}
		hs = append(hs, h)
	}
	return hs
}

// StayHeld fails t at once if a lock of hs other than except ends within
// d; what says what was done to except.
func StayHeld(t testing.TB, hs []locker.Handle, except locker.Handle, d time.Duration, what string) {
	t.Helper()
	ended := make(chan int, len(hs))
	for i, h := range hs {
		if h != except {
			go func() { <-h.Done(); ended <- i }()
		}
	}
	select {
	case i := <-ended:
		t.Fatalf("lock %d of %d ended with %v when %s", i, len(hs), hs[i].Err(), what)
	case <-time.After(d):
	}
}

// AwaitLost fails t unless h ends with an error wrapping locker.ErrLost
// within d.
func AwaitLost(t testing.TB, h locker.Handle, d time.Duration) {
	t.Helper()
	select {
	case <-h.Done():
		if err := h.Err(); !errors.Is(err, locker.ErrLost) {
			t.Fatalf("the lock ended with %v, want an error wrapping locker.ErrLost", err)
		}
	case <-time.After(d):
		t.Fatalf("the lock was not reported lost within %v", d)
	}
}
