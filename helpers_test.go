package locker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/memlock"
)

func TestTryDo(t *testing.T) {
	ls := newStoreLockers(t, 2)
	h, err := ls[0].Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	called := false
	err = locker.TryDo(t.Context(), ls[1], "k", func(context.Context, locker.Handle) error { called = true; return nil })
	if !errors.Is(err, locker.ErrNotAcquired) || called {
		t.Fatalf("TryDo on a held key = %v (fn called: %v), want ErrNotAcquired without fn", err, called)
	}
	if err := h.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	errFn := errors.New("fn failed")
	err = locker.TryDo(t.Context(), ls[1], "k", func(ctx context.Context, h locker.Handle) error {
		if _, err := ls[0].TryAcquire(ctx, "k"); !errors.Is(err, locker.ErrNotAcquired) {
			t.Errorf("lock not held during fn: %v", err)
		}
		return errFn
	})
	if !errors.Is(err, errFn) {
		t.Fatalf("TryDo = %v, want fn's error", err)
	}
	mustBeFree(t, ls[0], "k")
}

func TestHandleContext(t *testing.T) {
	s := memlock.NewStore()
	l := s.NewLocker()
	defer l.Close()
	h, err := l.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := locker.HandleContext(t.Context(), h)
	defer cancel()
	if ctx.Err() != nil {
		t.Fatal("context ended while the lock is held")
	}
	if !s.Revoke("k") {
		t.Fatal("Revoke found the key not held")
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("context not cancelled after the lock was lost")
	}
	if cause := context.Cause(ctx); !errors.Is(cause, locker.ErrLost) {
		t.Errorf("context.Cause = %v, want an error wrapping ErrLost", cause)
	}
	if err := h.Release(t.Context()); !errors.Is(err, locker.ErrLost) {
		t.Errorf("Release after Revoke = %v, want ErrLost", err)
	}

	// cancel alone ends the context, not the lock.
	h2, err := l.Acquire(t.Context(), "k2")
	if err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := locker.HandleContext(t.Context(), h2)
	cancel2()
	if ctx2.Err() == nil || h2.Err() != nil {
		t.Fatalf("after cancel: ctx err %v, lock err %v; want ctx ended, lock held", ctx2.Err(), h2.Err())
	}
	if err := h2.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestLeadDeposed: two candidates campaign; the leader's lock is revoked in
// the store. The deposed leader's work context is cancelled with a cause
// wrapping ErrLost, and a new term starts with a higher fencing token.
//
// memlock hands a revoked or expired key to the next waiter in the same
// step that tells the holder, so here the two terms may overlap by a few
// scheduling instants (the fencing token is what protects writes then). On
// a network backend the holder declares the loss by its own clock a drift
// margin before the server lets anyone else in: the integration tests check
// there that the old term ends before the new one starts.
func TestLeadDeposed(t *testing.T) {
	s := memlock.NewStore()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type event struct {
		who   int
		start bool
		token int64
		cause error
	}
	events := make(chan event, 16)
	done := make(chan error, 2)
	for i := range 2 {
		l := s.NewLocker()
		t.Cleanup(func() { _ = l.Close() })
		go func() {
			done <- locker.Lead(ctx, l, "leader", func(ctx context.Context, h locker.Handle) error {
				events <- event{who: i, start: true, token: h.Token()}
				<-ctx.Done()
				events <- event{who: i, token: h.Token(), cause: context.Cause(ctx)}
				return ctx.Err()
			})
		}()
	}
	first := <-events
	if !first.start {
		t.Fatalf("first event %+v is not a start", first)
	}
	if !s.Revoke("leader") {
		t.Fatal("Revoke: leader key not held")
	}
	var stopped, next *event
	for stopped == nil || next == nil {
		select {
		case e := <-events:
			switch {
			case !e.start && e.token == first.token:
				stopped = &e
			case e.start:
				next = &e
			default:
				t.Fatalf("unexpected event %+v", e)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("after Revoke: old term stopped %v, new term %v", stopped, next)
		}
	}
	if !errors.Is(stopped.cause, locker.ErrLost) {
		t.Errorf("deposed leader's context cause %v, want an error wrapping ErrLost", stopped.cause)
	}
	if next.token <= first.token {
		t.Errorf("new term's token %d not above the deposed one's %d", next.token, first.token)
	}
	cancel()
	for range 2 {
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Lead after cancel = %v, want context.Canceled", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Lead did not return after its ctx was cancelled")
		}
	}
	l := s.NewLocker()
	defer l.Close()
	mustBeFree(t, l, "leader")
}

func TestLeadReturnsFnError(t *testing.T) {
	ls := newStoreLockers(t, 2)
	errFn := errors.New("work failed")
	err := locker.Lead(t.Context(), ls[0], "leader", func(context.Context, locker.Handle) error { return errFn })
	if !errors.Is(err, errFn) {
		t.Fatalf("Lead = %v, want fn's error", err)
	}
	mustBeFree(t, ls[1], "leader")
}

func TestLeadClosedLocker(t *testing.T) {
	ls := newStoreLockers(t, 1)
	_ = ls[0].Close()
	err := locker.Lead(t.Context(), ls[0], "leader", func(context.Context, locker.Handle) error {
		t.Error("fn ran on a closed Locker")
		return nil
	})
	if !errors.Is(err, locker.ErrClosed) {
		t.Fatalf("Lead on a closed Locker = %v, want ErrClosed", err)
	}
}

func TestLeadStepsDownWhenFnReturns(t *testing.T) {
	ls := newStoreLockers(t, 2)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	terms := make(chan int64, 8)
	go func() {
		_ = locker.Lead(ctx, ls[0], "leader", func(_ context.Context, h locker.Handle) error {
			terms <- h.Token()
			return nil // done for now: step down, campaign again
		})
	}()
	a, b := <-terms, <-terms
	if b <= a {
		t.Fatalf("second term's token %d not above the first's %d: Lead did not step down between terms", b, a)
	}
	cancel()
}
