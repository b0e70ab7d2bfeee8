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

// deadlineWhileCut: a client cut off from the backend honours ctx too. An
// Acquire of a free key while cut off returns by its deadline (with an error:
// it cannot have taken the key), rather than retrying until the network
// heals; and once healed, whatever the abandoned call may have left on the
// backend does not outlive the expiry bound.
func (s *suite) deadlineWhileCut(t *testing.T, ctx context.Context) {
	s.needCut(t)
	a, b := s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	heal := s.h.Cut(t, a)
	defer heal() // also frees an Acquire that hangs, once the case has failed
	const d = 500 * time.Millisecond
	for _, call := range []struct {
		name string
		fn   func(context.Context, string, ...locker.Option) (locker.Handle, error)
	}{{"Acquire", a.Acquire}, {"TryAcquire", a.TryAcquire}} {
		wctx, cancel := context.WithTimeout(ctx, d)
		start := time.Now()
		ch := make(chan result, 1)
		go func() {
			h, err := call.fn(wctx, k, ttl(s))
			ch <- result{h, err, time.Now()}
		}()
		r := await(t, ch, d+prompt, call.name+" of a free key by a client cut off from the backend, with a deadline (it must honour ctx)")
		cancel()
		if r.err == nil {
			_ = r.h.Release(ctx)
			t.Fatalf("%s by a client cut off from the backend succeeded", call.name)
		}
		t.Logf("%s while cut off returned after %v: %v", call.name, r.at.Sub(start), r.err)
	}
	heal()
	healed := time.Now()
	mustRelease(t, ctx, s.awaitAfterFault(t, goAcquire(ctx, b, k), healed, nil,
		"the heal of a client whose calls were abandoned while cut off (did they leave a lock behind?)"))
}
