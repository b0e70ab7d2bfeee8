package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/lease"
)

// testHandle returns a Handle of l as an acquisition would make it, without
// a server.
func testHandle(l *Locker, key string) *Handle {
	return newHandle(l, key, l.keysFor(key), lease.NewOwner(), nil, 1, time.Minute, time.Second, time.Now())
}

// TestSecondReleaseHonoursItsContext: a Release while another Release of the
// same handle is still at work waits for its verdict only as long as its own
// context allows.
func TestSecondReleaseHonoursItsContext(t *testing.T) {
	l := New(nil)
	h := testHandle(l, "k")
	h.c.Claim() // the first Release is in flight
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := h.Release(ctx)
	if took := time.Since(start); took > 100*time.Millisecond+slack {
		t.Errorf("second Release returned %v after the call, its context ended after 100ms", took)
	}
	var le *locker.Error
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &le) || le.Op != "release" || le.Key != "k" {
		t.Errorf("second Release whose context ended: %v, want a *locker.Error for release of \"k\" wrapping context.DeadlineExceeded", err)
	}
	h.end(locker.ErrReleased) // the first one finishes
	if err := h.Release(context.Background()); !errors.Is(err, locker.ErrReleased) {
		t.Errorf("Release after the first finished: %v, want ErrReleased", err)
	}
}

// TestEndedErrNamesOpAndKey: a Release of a handle that Close released, or
// that was lost, returns a *locker.Error with op "release" and the key, and
// the cause intact.
func TestEndedErrNamesOpAndKey(t *testing.T) {
	l := New(nil)
	for _, tc := range []struct {
		end  error
		want []error
	}{
		{locker.ErrReleasedByClose, []error{locker.ErrReleased, locker.ErrClosed}},
		{locker.ErrReleased, []error{locker.ErrReleased}},
		{nil, []error{locker.ErrLost}}, // h.lostErr below
	} {
		h := testHandle(l, "some/key")
		end := tc.end
		if end == nil {
			end = h.lostErr("lease ran out")
		}
		h.end(end)
		err := h.Release(context.Background())
		var le *locker.Error
		if !errors.As(err, &le) || le.Op != "release" || le.Key != "some/key" {
			t.Errorf("Release of a handle ended with %v: %v, want a *locker.Error for release of \"some/key\"", end, err)
		}
		for _, w := range tc.want {
			if !errors.Is(err, w) {
				t.Errorf("Release of a handle ended with %v: %v, want it to wrap %v", end, err, w)
			}
		}
	}
}

// TestStartAfterEndKeepsNoLease: a handle that Close ended between its
// registration and the start of its lease (Close took it over while the
// acquire was finishing) keeps no lease: its renewal and loss timers are
// stopped at once, as a Release or Close would have stopped them.
func TestStartAfterEndKeepsNoLease(t *testing.T) {
	l := New(nil)
	h := testHandle(l, "k")
	h.end(locker.ErrReleasedByClose) // Close ended it before start
	h.start()
	if ls := h.c.Lease(); ls != nil && ls.Stop() {
		t.Error("an ended handle's lease was still kept after start")
	}
}
