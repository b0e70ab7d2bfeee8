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
		start := time.Now()
		h, err := call.fn(cctx, k)
		took := time.Since(start)
		if err == nil {
			_ = h.Release(ctx)
			t.Errorf("%s with a cancelled context succeeded", call.name)
		} else if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: %v, want an error wrapping context.Canceled", call.name, err)
		}
		if took > s.h.CtxSlack {
			t.Errorf("%s with a context cancelled before the call took %v, more than CtxSlack %v", call.name, took, s.h.CtxSlack)
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
	} else {
		checkKeyError(t, r.err, k, "Acquire whose context ended while waiting")
	}
	late := r.at.Sub(ended)
	t.Logf("wait returned %v after its context ended", late)
	if late > s.h.CtxSlack {
		t.Errorf("Acquire returned %v after its context ended, more than CtxSlack %v", late, s.h.CtxSlack)
	}
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
// Acquire or TryAcquire of a free key while cut off returns by its deadline
// (plus CtxSlack), rather than retrying until the network heals, with an
// error that is not ErrNotAcquired: callers skip work on ErrNotAcquired, so
// an outage reported as "someone else has it" silently drops their jobs. Once
// healed, whatever the abandoned calls may have left on the backend does not
// outlive the expiry bound.
func (s *suite) deadlineWhileCut(t *testing.T, ctx context.Context) {
	s.cutCalls(t, ctx, "deadline", context.DeadlineExceeded, func() (context.Context, context.CancelFunc, func()) {
		wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		return wctx, cancel, func() { <-wctx.Done() }
	})
}

// cancelWhileCut: the same with a plain cancel(), no deadline: a client
// library that turns only deadlines into socket deadlines leaves a request
// in flight that a cancel does not stop; the backend must stop waiting for
// it all the same.
func (s *suite) cancelWhileCut(t *testing.T, ctx context.Context) {
	s.cutCalls(t, ctx, "cancel", context.Canceled, func() (context.Context, context.CancelFunc, func()) {
		wctx, cancel := context.WithCancel(ctx)
		return wctx, cancel, func() { time.Sleep(500 * time.Millisecond); cancel() }
	})
}

// cutCalls runs Acquire, TryAcquire, Acquire again and Release on a client
// cut off from the backend, each with a context from mk that end ends; each
// must return within CtxSlack of the end, with an error wrapping want when it
// returns after the end (a call may fail sooner with a backend error of its
// own), never with ErrNotAcquired, and Release never with nil.
func (s *suite) cutCalls(t *testing.T, ctx context.Context, how string, want error, mk func() (context.Context, context.CancelFunc, func())) {
	s.needCut(t)
	a, b := s.newLocker(t), s.newLocker(t)
	k, held := key(t, ""), key(t, "/held")
	h := mustAcquire(t, ctx, a, held, ttl(s))
	heal := s.cut(t, a)
	defer heal() // also frees a call that hangs, once the case has failed
	for _, call := range []struct {
		name string
		fn   func(context.Context) (locker.Handle, error)
	}{
		{"Acquire", func(c context.Context) (locker.Handle, error) { return a.Acquire(c, k, ttl(s)) }},
		{"TryAcquire", func(c context.Context) (locker.Handle, error) { return a.TryAcquire(c, k, ttl(s)) }},
		// Again, after a call that timed out: a backend may make its
		// requests another way once one was slow (the Redis Locker runs
		// them off the caller's goroutine then, where one that wrote to
		// what the caller reads after giving up was a data race).
		{"Acquire again", func(c context.Context) (locker.Handle, error) { return a.Acquire(c, k, ttl(s)) }},
		{"Release", func(c context.Context) (locker.Handle, error) { return nil, h.Release(c) }},
	} {
		wctx, cancel, end := mk()
		start := time.Now()
		ch := make(chan result, 1)
		go func() {
			h, err := call.fn(wctx)
			ch <- result{h, err, time.Now()}
		}()
		end()
		ended := time.Now()
		r := await(t, ch, s.h.CtxSlack+prompt, call.name+" by a client cut off from the backend, whose context ended by "+how+" (it must honour ctx)")
		cancel()
		if r.h != nil {
			_ = r.h.Release(ctx)
			t.Fatalf("%s by a client cut off from the backend succeeded", call.name)
		}
		t.Logf("%s while cut off returned %v after the call, %v after its context ended by %s: %v", call.name, r.at.Sub(start), r.at.Sub(ended), how, r.err)
		switch {
		case r.err == nil:
			t.Errorf("%s while cut off from the backend returned nil; a call that could not reach the backend must say so", call.name)
		case errors.Is(r.err, locker.ErrNotAcquired):
			t.Errorf("%s while cut off from the backend: %v; ErrNotAcquired means another holder has the key, and callers that skip work on it would silently drop it during an outage", call.name, r.err)
		case r.at.After(ended) && !errors.Is(r.err, want) && call.name != "Release":
			t.Errorf("%s while cut off, returning after its context ended by %s: %v, want an error wrapping %v", call.name, how, r.err, want)
		}
		if r.err != nil && call.name != "Release" {
			checkKeyError(t, r.err, k, call.name+" while cut off")
		}
		if late := r.at.Sub(ended); late > s.h.CtxSlack {
			t.Errorf("%s while cut off returned %v after its context ended by %s, more than CtxSlack %v", call.name, late, how, s.h.CtxSlack)
		}
	}
	if !isClosed(h.Done()) {
		t.Errorf("Done() still open after a Release while cut off: Release gives the lock up whatever it returns")
	}
	heal()
	healed := time.Now()
	mustRelease(t, ctx, s.awaitAfterFault(t, goAcquire(ctx, b, k), healed, nil,
		"the heal of a client whose calls were abandoned while cut off (did they leave a lock behind?)"))
	mustRelease(t, ctx, s.awaitAfterFault(t, goAcquire(ctx, b, held), healed, h,
		"the heal of a client whose Release failed while cut off"))
}

// errCallerGaveUp is the cause the Context/Cause case cancels with.
var errCallerGaveUp = errors.New("conformance: the caller gave up")

// cancelCause: a call ended by a context.WithCancelCause (or a deadline
// with a cause) reports both: errors.Is(err, context.Canceled) (or
// DeadlineExceeded), which callers test for, and errors.Is(err, cause),
// which says why. So do locker.Do, TryDo and Lead over the backend.
func (s *suite) cancelCause(t *testing.T, ctx context.Context) {
	holder, waiter := s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	check := func(what string, err, want error) {
		t.Helper()
		switch {
		case err == nil:
			t.Errorf("%s: succeeded, want an error wrapping %v and the cause", what, want)
		case !errors.Is(err, want) || !errors.Is(err, errCallerGaveUp):
			t.Errorf("%s: %v, want an error wrapping both %v and the cause %q", what, err, want, errCallerGaveUp)
		}
	}
	cancelled := func() context.Context {
		c, cancel := context.WithCancelCause(ctx)
		cancel(errCallerGaveUp)
		return c
	}
	// Ended before the call.
	for _, call := range []struct {
		name string
		fn   func(context.Context, string, ...locker.Option) (locker.Handle, error)
	}{{"Acquire", waiter.Acquire}, {"TryAcquire", waiter.TryAcquire}} {
		h, err := call.fn(cancelled(), k)
		if err == nil {
			_ = h.Release(ctx)
		}
		check(call.name+" with a context cancelled with a cause", err, context.Canceled)
	}
	noWork := func(context.Context, locker.Handle) error { return errors.New("conformance: fn ran") }
	check("TryDo with a context cancelled with a cause", locker.TryDo(cancelled(), waiter, k, noWork), context.Canceled)

	// Ended while waiting for a held key.
	h := mustAcquire(t, ctx, holder, k)
	wait := func(name string, mk func() (context.Context, func()), want error, call func(context.Context) error) {
		t.Helper()
		wctx, end := mk()
		ch := make(chan error, 1)
		go func() { ch <- call(wctx) }()
		select {
		case err := <-ch:
			t.Fatalf("%s of a held key returned before its context ended: %v", name, err)
		case <-time.After(200 * time.Millisecond):
		}
		end()
		select {
		case err := <-ch:
			check(name+" whose context ended with a cause while waiting", err, want)
		case <-time.After(prompt):
			t.Fatalf("%s whose context ended with a cause is still waiting after %v", name, prompt)
		}
	}
	withCause := func() (context.Context, func()) {
		c, cancel := context.WithCancelCause(ctx)
		return c, func() { cancel(errCallerGaveUp) }
	}
	acquire := func(c context.Context) error {
		hw, err := waiter.Acquire(c, k)
		if err == nil {
			_ = hw.Release(ctx)
		}
		return err
	}
	wait("Acquire", withCause, context.Canceled, acquire)
	wait("Acquire", func() (context.Context, func()) {
		c, cancel := context.WithTimeoutCause(ctx, 400*time.Millisecond, errCallerGaveUp)
		return c, func() { <-c.Done(); cancel() }
	}, context.DeadlineExceeded, acquire)
	wait("Do", withCause, context.Canceled, func(c context.Context) error { return locker.Do(c, waiter, k, noWork) })
	wait("Lead (campaigning)", withCause, context.Canceled, func(c context.Context) error { return locker.Lead(c, waiter, k, noWork) })
	mustRelease(t, ctx, h)

	// Ended while leading: fn returns when its context ends. The context
	// ends once fn runs (a slow backend may take a while to grant the key).
	led := make(chan struct{}, 1)
	lctx, end := withCause()
	ch := make(chan error, 1)
	go func() {
		ch <- locker.Lead(lctx, waiter, k, func(fctx context.Context, _ locker.Handle) error {
			led <- struct{}{}
			<-fctx.Done()
			return nil
		})
	}()
	select {
	case <-led:
	case err := <-ch:
		t.Fatalf("Lead of a free key returned before its context ended: %v", err)
	case <-time.After(s.h.HandoffBound + prompt):
		t.Fatalf("Lead of a free key did not run fn within %v", s.h.HandoffBound+prompt)
	}
	end()
	select {
	case err := <-ch:
		check("Lead (leading) whose context ended with a cause", err, context.Canceled)
	case <-time.After(prompt):
		t.Fatalf("Lead (leading) whose context ended with a cause still runs after %v", prompt)
	}
	// Nothing is left behind.
	mustRelease(t, ctx, mustTry(t, ctx, holder, k))
}
