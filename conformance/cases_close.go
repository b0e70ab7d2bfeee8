package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/go-locker/locker"
)

// closeReleasesHeld: Close frees what the Locker held, at once, and every
// later call fails with ErrClosed.
func (s *suite) closeReleasesHeld(t *testing.T, ctx context.Context) {
	a, b, c := s.newLocker(t), s.newLocker(t), s.newLocker(t)
	k1, k2 := key(t, "/1"), key(t, "/2")
	h1 := mustAcquire(t, ctx, a, k1)
	h2 := mustAcquire(t, ctx, a, k2)
	ch := goAcquire(ctx, b, k1)
	stillWaiting(t, ch, "Acquire of a key held by a Locker about to close")
	if err := a.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	r := await(t, ch, s.h.HandoffBound+prompt, "Acquire of a key whose holder closed (Close must release it, not leave its lease to run out)")
	if r.err != nil {
		t.Fatalf("Acquire of a key whose holder closed: %v", r.err)
	}
	mustRelease(t, ctx, r.h)
	mustRelease(t, ctx, mustTry(t, ctx, c, k2))
	for _, h := range []locker.Handle{h1, h2} {
		waitDone(t, h, prompt, "handle of a closed Locker")
		if err := h.Err(); !errors.Is(err, locker.ErrClosed) || !errors.Is(err, locker.ErrReleased) {
			t.Errorf("Err() of %q after its Locker closed = %v, want an error wrapping locker.ErrReleased and locker.ErrClosed (locker.ErrReleasedByClose)", h.Key(), err)
		}
		rctx, cancel := context.WithTimeout(ctx, prompt)
		if err := h.Release(rctx); err == nil {
			t.Errorf("Release of %q after its Locker closed returned nil; the lock was already given up by Close", h.Key())
		}
		cancel()
	}
	if _, err := a.Acquire(ctx, k1); !errors.Is(err, locker.ErrClosed) {
		t.Errorf("Acquire after Close: %v, want an error wrapping locker.ErrClosed", err)
	}
	if _, err := a.TryAcquire(ctx, key(t, "/3")); !errors.Is(err, locker.ErrClosed) {
		t.Errorf("TryAcquire after Close: %v, want an error wrapping locker.ErrClosed", err)
	}
	if err := a.Close(); err != nil && !errors.Is(err, locker.ErrClosed) {
		t.Errorf("second Close: %v, want nil or an error wrapping locker.ErrClosed", err)
	}
}

// closeWakesOwnWaiters: Close ends the Locker's own waits with ErrClosed.
func (s *suite) closeWakesOwnWaiters(t *testing.T, ctx context.Context) {
	a, b := s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	hb := mustAcquire(t, ctx, b, k)
	ch := goAcquire(ctx, a, k)
	stillWaiting(t, ch, "Acquire of a held key")
	if err := a.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	r := await(t, ch, prompt, "Acquire waiting on a Locker that closed")
	if r.err == nil {
		t.Fatalf("Acquire waiting on a Locker that closed succeeded")
	}
	if !errors.Is(r.err, locker.ErrClosed) {
		t.Errorf("Acquire waiting on a Locker that closed: %v, want an error wrapping locker.ErrClosed", r.err)
	}
	if err := hb.Err(); err != nil {
		t.Errorf("another client's lock was disturbed by Close: Err() = %v", err)
	}
	mustRelease(t, ctx, hb)
}

// noGoroutineLeak: nothing a Locker started runs after Close (and after the
// harness's own cleanup of the client it made).
func (s *suite) noGoroutineLeak(t *testing.T, ctx context.Context) {
	if s.h.SkipLeakCheck {
		t.Skip("conformance: Harness.SkipLeakCheck is set")
	}
	opts := []goleak.Option{goleak.IgnoreCurrent()}
	for _, fn := range s.h.IgnoreGoroutines {
		opts = append(opts, goleak.IgnoreAnyFunction(fn))
	}
	t.Run("Use", func(t *testing.T) {
		a, b := s.h.NewLocker(t), s.h.NewLocker(t)
		// Closed below; these only clean up after an early failure.
		t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
		k := key(t, "")
		h := mustAcquire(t, ctx, a, k, ttl(s))
		wctx, cancel := context.WithCancel(ctx)
		ch := goAcquire(wctx, b, k)
		stillWaiting(t, ch, "Acquire of a held key")
		cancel()
		if r := await(t, ch, prompt, "cancelled Acquire"); r.err == nil {
			t.Fatal("cancelled Acquire succeeded")
		}
		mustNotTry(t, ctx, b, k, "another client holds it")
		other := key(t, "/other")
		if _, err := a.Acquire(ctx, other, ttl(s)); err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		mustRelease(t, ctx, h)
		// b waits for the second lock, held by a, when both close: Close
		// must end that wait, release the lock and stop whatever keeps it
		// alive, and leave no goroutine behind for either.
		held := goAcquire(ctx, b, other, ttl(s))
		stillWaiting(t, held, "Acquire of a held key")
		for _, l := range []locker.Locker{b, a} {
			if err := l.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
		if r := await(t, held, prompt, "Acquire whose Locker closed"); r.err == nil {
			t.Error("Acquire whose Locker closed while it waited succeeded")
		}
	})
	if err := goleak.Find(opts...); err != nil {
		t.Errorf("goroutines still running after Close: %v", err)
	}
}

// closeWhileCut: Close of a Locker cut off from the backend while it holds
// a lock cannot release it, and must say so: it returns within
// ReleaseTimeout (plus the slack of a call) with an error, and the handle
// ends (Done closed) with an error wrapping locker.ErrLost and
// locker.ErrClosed, not locker.ErrReleased: the lock stays on the server
// until its lease or session ends. Once that has happened another client
// gets the key.
func (s *suite) closeWhileCut(t *testing.T, ctx context.Context) {
	s.needCut(t)
	a, b := s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	h := mustAcquire(t, ctx, a, k, ttl(s))
	heal := s.cut(t, a)
	defer heal()
	cutAt := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	bound := locker.ReleaseTimeout + s.h.CtxSlack + prompt
	var err error
	select {
	case err = <-closed:
		t.Logf("Close of a Locker cut off while holding a lock returned after %v: %v", time.Since(cutAt), err)
	case <-time.After(bound):
		t.Fatalf("Close of a Locker cut off while holding a lock had not returned after %v", bound)
	}
	if err == nil {
		t.Errorf("Close of a Locker cut off while it held %q returned nil: it could not release the lock and must say so", k)
	}
	select {
	case <-h.Done():
	default:
		t.Fatalf("Done of %q still open after its Locker's Close returned", k)
	}
	if herr := h.Err(); !errors.Is(herr, locker.ErrLost) || !errors.Is(herr, locker.ErrClosed) || errors.Is(herr, locker.ErrReleased) {
		t.Errorf("Err() of %q after a Close that could not reach the backend = %v, want an error wrapping locker.ErrLost and locker.ErrClosed, not locker.ErrReleased (the lock was not released)", k, herr)
	}
	heal()
	// The key is free ExpiryBound after the cut; Close may have taken
	// longer than that to give up (ReleaseTimeout), and the other client's
	// Acquire then still gets its prompt.
	by := cutAt.Add(s.h.ExpiryBound + prompt)
	if soon := time.Now().Add(prompt); soon.After(by) {
		by = soon
	}
	wctx, cancel := context.WithDeadline(ctx, by)
	defer cancel()
	hb, err := b.Acquire(wctx, k, ttl(s))
	if err != nil {
		t.Fatalf("another client could not take %q within ExpiryBound (%v) of the cut: %v", k, s.h.ExpiryBound, err)
	}
	_ = hb.Release(ctx)
}
