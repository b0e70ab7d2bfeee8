package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// cancelledBeforeCall: a call with a context already ended takes nothing.
func (s *suite) cancelledBeforeCall(t *testing.T, ctx context.Context) {
	a, b := s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	for _, call := range []struct {
		name string
		fn   func(context.Context, string, ...locker.Option) (locker.Handle, error)
	}{{"Acquire", a.Acquire}, {"TryAcquire", a.TryAcquire}} {
		h, err := call.fn(cctx, k)
		if err == nil {
			_ = h.Release(ctx)
			t.Errorf("%s with a cancelled context succeeded", call.name)
		} else if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: %v, want an error wrapping context.Canceled", call.name, err)
		}
	}
	mustRelease(t, ctx, mustTry(t, ctx, b, k))
}

// abandonWait starts a wait for a held key on waiter with the context that
// start makes (made only now, so that a deadline does not run during set-up),
// ends it with end, and checks that it returns promptly with an error
// wrapping want and that the abandoned wait leaves the key to others.
func (s *suite) abandonWait(t *testing.T, ctx context.Context, start func() (context.Context, context.CancelFunc), end func(wctx context.Context, cancel context.CancelFunc), want error) {
	holder, waiter, other := s.newLocker(t), s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	h := mustAcquire(t, ctx, holder, k)
	wctx, cancel := start()
	defer cancel()
	ch := goAcquire(wctx, waiter, k)
	stillWaiting(t, ch, "Acquire of a held key")
	end(wctx, cancel)
	ended := time.Now()
	r := await(t, ch, prompt, "Acquire whose context ended while waiting")
	if r.err == nil {
		_ = r.h.Release(ctx)
		t.Fatalf("Acquire whose context ended while waiting succeeded")
	}
	if !errors.Is(r.err, want) {
		t.Errorf("Acquire whose context ended while waiting: %v, want an error wrapping %v", r.err, want)
	}
	t.Logf("wait returned %v after its context ended", r.at.Sub(ended))
	mustRelease(t, ctx, h)
	// The abandoned wait must neither take the key nor hold it up.
	hk := mustTry(t, ctx, other, k)
	mustRelease(t, ctx, hk)
	mustRelease(t, ctx, mustAcquire(t, ctx, waiter, k))
}

// cancelWhileWaiting: cancelling a wait ends it with context.Canceled.
func (s *suite) cancelWhileWaiting(t *testing.T, ctx context.Context) {
	s.abandonWait(t, ctx,
		func() (context.Context, context.CancelFunc) { return context.WithCancel(ctx) },
		func(_ context.Context, cancel context.CancelFunc) { cancel() },
		context.Canceled)
}

// deadlineWhileWaiting: a wait ends at its deadline with DeadlineExceeded.
func (s *suite) deadlineWhileWaiting(t *testing.T, ctx context.Context) {
	// Long enough that the deadline cannot pass within stillWaiting's
	// window on a loaded machine.
	const d = time.Second
	s.abandonWait(t, ctx,
		func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, d) },
		func(wctx context.Context, _ context.CancelFunc) { <-wctx.Done() },
		context.DeadlineExceeded)
}
