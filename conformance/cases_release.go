package conformance

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// releaseTwice: the second Release says the lock was already released, and
// touches nothing even after the same client has taken the key again: the
// owner a backend compares must identify the acquisition, not the client.
func (s *suite) releaseTwice(t *testing.T, ctx context.Context) {
	a, b := s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	h := mustAcquire(t, ctx, a, k)
	mustRelease(t, ctx, h)
	again := mustAcquire(t, ctx, a, k)
	if err := h.Release(ctx); !errors.Is(err, locker.ErrReleased) {
		t.Errorf("second Release: %v, want an error wrapping locker.ErrReleased", err)
	}
	if err := h.Err(); !errors.Is(err, locker.ErrReleased) {
		t.Errorf("Err() after a second Release = %v, want locker.ErrReleased", err)
	}
	if err := again.Err(); err != nil {
		t.Errorf("Err() of the client's new lock on the key = %v after a second Release of its old handle, want nil", err)
	}
	mustNotTry(t, ctx, b, k, "the second Release of an old handle must leave the same client's new lock alone")
	mustRelease(t, ctx, again)
}

// releaseConcurrent: Releases of one handle racing each other (a Handle is
// safe for concurrent use) give the lock up once: exactly one returns nil,
// the others say it was already released, and the key is free afterwards.
func (s *suite) releaseConcurrent(t *testing.T, ctx context.Context) {
	const n = 8
	a, b := s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	h := mustAcquire(t, ctx, a, k)
	var (
		start = make(chan struct{})
		errs  = make(chan error, n)
	)
	for range n {
		go func() {
			<-start
			errs <- h.Release(ctx)
		}()
	}
	close(start)
	succeeded := 0
	for range n {
		var err error
		select {
		case err = <-errs:
		case <-time.After(prompt):
			t.Fatalf("concurrent Releases of one handle had not all returned after %v", prompt)
		}
		switch {
		case err == nil:
			succeeded++
		case !errors.Is(err, locker.ErrReleased):
			t.Errorf("one of %d concurrent Releases: %v, want nil or an error wrapping locker.ErrReleased", n, err)
		}
	}
	if succeeded != 1 {
		t.Errorf("%d of %d concurrent Releases of one handle returned nil, want exactly 1", succeeded, n)
	}
	if err := h.Err(); !errors.Is(err, locker.ErrReleased) {
		t.Errorf("Err() after concurrent Releases = %v, want locker.ErrReleased", err)
	}
	mustRelease(t, ctx, mustTry(t, ctx, b, k))
}

// cutAndLose cuts l off after it took key, and waits until its handle
// reports the loss. It returns the handle and the heal function.
func (s *suite) cutAndLose(t *testing.T, ctx context.Context, l locker.Locker, k string) (locker.Handle, func()) {
	t.Helper()
	h := mustAcquire(t, ctx, l, k, ttl(s))
	heal := s.cut(t, l)
	waitDone(t, h, s.h.ExpiryBound+prompt, "holder cut off from the backend")
	if err := h.Err(); !errors.Is(err, locker.ErrLost) {
		t.Errorf("Err() of a holder cut off until its lease ran out = %v, want an error wrapping locker.ErrLost", err)
	}
	return h, heal
}

// cut cuts l off with Harness.Cut and returns a heal that may be called
// more than once (a deferred heal after an explicit one); the Harness's own
// heal runs once.
func (s *suite) cut(t *testing.T, l locker.Locker) (heal func()) {
	t.Helper()
	h := s.h.Cut(t, l)
	var once sync.Once
	return func() { once.Do(h) }
}

func (s *suite) needCut(t *testing.T) {
	if s.h.Cut == nil {
		t.Skip("conformance: Harness.Cut is not set; set it to run the cases where a holder is cut off from the backend")
	}
}

func (s *suite) needCrash(t *testing.T) {
	if s.h.Crash == nil {
		t.Skip("conformance: Harness.Crash is not set; set it to run the cases where a holder dies without releasing")
	}
}

// awaitAfterFault waits for an Acquire started after a fault at since (a
// crash, a cut, a heal) and checks what every such case promises: the key is
// held within ExpiryBound of since, and, when prev is not nil, with a token
// above prev's. what names the fault in messages.
func (s *suite) awaitAfterFault(t *testing.T, ch <-chan result, since time.Time, prev locker.Handle, what string) locker.Handle {
	t.Helper()
	r := await(t, ch, s.h.ExpiryBound+prompt, "Acquire after "+what)
	if r.err != nil {
		t.Fatalf("Acquire after %s: %v (bound %v)", what, r.err, s.h.ExpiryBound)
	}
	took := r.at.Sub(since)
	t.Logf("key acquirable %v after %s (TTL %v, bound %v)", took, what, s.h.TTL, s.h.ExpiryBound)
	if took > s.h.ExpiryBound {
		t.Errorf("key acquirable only %v after %s, more than the bound %v", took, what, s.h.ExpiryBound)
	}
	if prev != nil && r.h.Token() <= prev.Token() {
		t.Errorf("token %d after %s is not greater than the previous holder's %d", r.h.Token(), what, prev.Token())
	}
	return r.h
}

// releaseAfterLoss: Release of a lost lock reports the loss, not success.
func (s *suite) releaseAfterLoss(t *testing.T, ctx context.Context) {
	s.needCut(t)
	l := s.newLocker(t)
	k := key(t, "")
	h, heal := s.cutAndLose(t, ctx, l, k)
	heal()
	rctx, cancel := context.WithTimeout(ctx, prompt)
	defer cancel()
	if err := h.Release(rctx); !errors.Is(err, locker.ErrLost) {
		t.Errorf("Release after loss: %v, want an error wrapping locker.ErrLost", err)
	} else {
		checkKeyError(t, err, k, "Release after loss")
	}
	// The key is free again (the lost lease ended), for anyone.
	other := s.newLocker(t)
	hb := mustAcquire(t, ctx, other, k)
	if hb.Token() <= h.Token() {
		t.Errorf("token %d after loss is not greater than the lost holder's %d", hb.Token(), h.Token())
	}
	mustRelease(t, ctx, hb)
}

// releaseNotOwner: a holder whose lock passed to another client releases
// nothing of the new holder's.
func (s *suite) releaseNotOwner(t *testing.T, ctx context.Context) {
	s.needCut(t)
	a, b, c := s.newLocker(t), s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	ha := mustAcquire(t, ctx, a, k, ttl(s))
	heal := s.cut(t, a)
	defer heal()
	r := await(t, goAcquire(ctx, b, k), s.h.ExpiryBound+prompt, "Acquire after the holder was cut off")
	if r.err != nil {
		t.Fatalf("Acquire after the holder was cut off: %v", r.err)
	}
	hb := r.h
	waitDone(t, ha, prompt, "holder whose lock went to another client")
	heal()
	if err := ha.Release(ctx); !errors.Is(err, locker.ErrLost) {
		t.Errorf("Release by the old holder: %v, want an error wrapping locker.ErrLost", err)
	} else {
		checkKeyError(t, err, k, "Release by the old holder")
	}
	if err := hb.Err(); err != nil {
		t.Errorf("new holder's Err() = %v after the old holder's Release, want nil", err)
	}
	mustNotTry(t, ctx, c, k, "the new holder must keep it after the old holder's Release")
	if hb.Token() <= ha.Token() {
		t.Errorf("new holder's token %d is not greater than the old holder's %d", hb.Token(), ha.Token())
	}
	mustRelease(t, ctx, hb)
}

// releaseWhileCut: a Release that cannot reach the backend returns when its
// context ends, and gives the lock up all the same, whatever it returns: the
// handle ends (nothing renews it any more), and the key frees within the
// expiry bound even though the holder stays cut off. A Release that fails
// must not leave a lock that its holder's watchdog keeps alive after a heal.
func (s *suite) releaseWhileCut(t *testing.T, ctx context.Context) {
	s.needCut(t)
	a, b := s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	h := mustAcquire(t, ctx, a, k, ttl(s))
	heal := s.cut(t, a)
	defer heal() // also frees a Release that hangs, once the case has failed
	cut := time.Now()
	const d = 500 * time.Millisecond
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	released := make(chan error, 1)
	go func() { released <- h.Release(rctx) }()
	select {
	case err := <-released:
		t.Logf("Release while cut off from the backend returned after %v: %v", time.Since(cut), err)
		if err == nil {
			t.Errorf("Release while cut off from the backend returned nil: a Release that could not reach the backend must say so")
		} else {
			checkKeyError(t, err, k, "Release while cut off")
		}
	case <-time.After(d + prompt):
		t.Fatalf("Release while cut off from the backend, with a context that ended after %v, had not returned %v later: it must honour ctx", d, prompt)
	}
	if !isClosed(h.Done()) {
		t.Errorf("Done() of %q still open after a Release that could not reach the backend: Release gives the lock up whatever it returns", k)
	} else if err := h.Err(); !errors.Is(err, locker.ErrReleased) && !errors.Is(err, locker.ErrLost) {
		t.Errorf("Err() after a Release while cut off = %v, want an error wrapping locker.ErrReleased or locker.ErrLost", err)
	}
	mustRelease(t, ctx, s.awaitAfterFault(t, goAcquire(ctx, b, k), cut, h, "its holder was cut off and released it"))
}

// releaseStopsRenewal: once released, a lock is no longer renewed, not even
// by a renewal that would land on the next holder's lock. The next holder
// crashes, and its lease must still run out within the expiry bound: a
// watchdog of the first holder that kept running, with a renewal that does
// not compare owners, would keep the dead holder's lock alive.
func (s *suite) releaseStopsRenewal(t *testing.T, ctx context.Context) {
	s.needCrash(t)
	a, b, c := s.newLocker(t), s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	ha := mustAcquire(t, ctx, a, k, ttl(s))
	mustRelease(t, ctx, ha)
	hb := mustAcquire(t, ctx, b, k, ttl(s))
	s.h.Crash(t, b)
	crashed := time.Now()
	mustRelease(t, ctx, s.awaitAfterFault(t, goAcquire(ctx, c, k), crashed, hb,
		"the second holder crashed (does the first, released handle still renew the key?)"))
}

// fencingAfterRelease: tokens keep increasing across holders and clients,
// and after the key sat free.
func (s *suite) fencingAfterRelease(t *testing.T, ctx context.Context) {
	ls := []locker.Locker{s.newLocker(t), s.newLocker(t), s.newLocker(t)}
	k := key(t, "")
	var prev int64
	for i := range 9 {
		var h locker.Handle
		if i%2 == 0 {
			h = mustAcquire(t, ctx, ls[i%3], k)
		} else {
			h = mustTry(t, ctx, ls[i%3], k)
		}
		if h.Token() <= prev {
			t.Errorf("acquisition %d got token %d, not greater than the previous %d", i, h.Token(), prev)
		}
		prev = h.Token()
		mustRelease(t, ctx, h)
	}
}

// fencingAfterCrash: a holder that dies stops blocking others within the
// expiry bound, and the next holder's token is higher.
func (s *suite) fencingAfterCrash(t *testing.T, ctx context.Context) {
	s.needCrash(t)
	a, b := s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	ha := mustAcquire(t, ctx, a, k, ttl(s))
	s.h.Crash(t, a)
	crashed := time.Now()
	mustRelease(t, ctx, s.awaitAfterFault(t, goAcquire(ctx, b, k), crashed, ha, "the holder crashed"))
}

// doneOnCut: a holder cut off from the backend hears that its lock is lost
// no later than another client acquires it.
func (s *suite) doneOnCut(t *testing.T, ctx context.Context) {
	s.needCut(t)
	s.lossBeforeNext(t, ctx, s.newLocker(t), s.newLocker(t))
}

// lossBeforeNext: a, holding a key, is cut off; b's Acquire of the key
// succeeds within ExpiryBound, and by then a's Done is closed and its Err
// wraps ErrLost; b's token is greater.
func (s *suite) lossBeforeNext(t *testing.T, ctx context.Context, a, b locker.Locker) {
	t.Helper()
	k := key(t, "")
	ha := mustAcquire(t, ctx, a, k, ttl(s))
	heal := s.cut(t, a)
	defer heal()
	cut := time.Now()
	// Look at the holder the moment the other client's Acquire returns.
	var lostFirst atomic.Bool
	ch := make(chan result, 1)
	go func() {
		h, err := b.Acquire(ctx, k)
		lostFirst.Store(isClosed(ha.Done()))
		ch <- result{h, err, time.Now()}
	}()
	hb := s.awaitAfterFault(t, ch, cut, ha, "the holder was cut off")
	if !lostFirst.Load() {
		t.Errorf("another client acquired the key while the cut-off holder's Done() was still open: the holder must hear of the loss first")
	}
	if err := ha.Err(); !errors.Is(err, locker.ErrLost) {
		t.Errorf("cut-off holder's Err() = %v, want an error wrapping locker.ErrLost", err)
	}
	mustRelease(t, ctx, hb)
}

// renewalKeepsLock: a live holder keeps its lock well past its TTL.
func (s *suite) renewalKeepsLock(t *testing.T, ctx context.Context) {
	a, b := s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	h := mustAcquire(t, ctx, a, k, ttl(s))
	select {
	case <-h.Done():
		t.Fatalf("holder lost its lock within 3×TTL while alive and connected: %v", h.Err())
	case <-time.After(3 * s.h.TTL):
	}
	if err := h.Err(); err != nil {
		t.Errorf("Err() of a lock held past its TTL by renewal = %v, want nil while Done() is open", err)
	}
	mustNotTry(t, ctx, b, k, "its holder is alive and renewing past its TTL")
	mustRelease(t, ctx, h)
}
