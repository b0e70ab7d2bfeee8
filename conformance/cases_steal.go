package conformance

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// The Steal cases take a lock away on the server while its holder still
// believes it holds it (a paused process, an eviction, a failover, an
// operator). A backend that checks only its own state before it releases or
// renews passes every case where the holder already knows; these catch the
// release and the renewal that do not compare owners on the server.

func (s *suite) needSteal(t *testing.T) {
	if s.h.Steal == nil {
		t.Skip("conformance: Harness.Steal is not set; set it to run the cases where the server takes a lock away from a holder that does not know")
	}
}

// steal takes k from a fresh holder on a and gives it to b: it returns the
// robbed handle (still believing, as far as the suite knows) and b's.
func (s *suite) steal(t *testing.T, ctx context.Context, a, b locker.Locker, k string) (robbed, next locker.Handle) {
	t.Helper()
	robbed = mustAcquire(t, ctx, a, k, ttl(s))
	s.h.Steal(t, robbed)
	stolen := time.Now()
	// The key is free on the server now: another client takes it without
	// waiting for a lease to run out.
	r := await(t, goAcquire(ctx, b, k, ttl(s)), s.h.HandoffBound+prompt, "Acquire after the lock was taken away on the server")
	if r.err != nil {
		t.Fatalf("Acquire after the lock was taken away on the server: %v", r.err)
	}
	t.Logf("key acquired %v after it was taken away on the server", r.at.Sub(stolen))
	if took := r.at.Sub(stolen); took > s.h.HandoffBound {
		t.Errorf("another client needed %v to acquire a key taken away on the server, more than HandoffBound %v: a stolen key is free at once", took, s.h.HandoffBound)
	}
	if r.h.Token() <= robbed.Token() {
		t.Errorf("token %d of the holder after a steal is not greater than the robbed holder's %d", r.h.Token(), robbed.Token())
	}
	return robbed, r.h
}

// stealReleaseKeepsNewHolder: the robbed holder's Release, made at once,
// before it may have noticed anything, must not remove the new holder's
// lock. It reports the loss.
func (s *suite) stealReleaseKeepsNewHolder(t *testing.T, ctx context.Context) {
	s.needSteal(t)
	a, b, c := s.newLocker(t), s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	robbed, next := s.steal(t, ctx, a, b, k)
	rctx, cancel := context.WithTimeout(ctx, prompt)
	defer cancel()
	err := robbed.Release(rctx)
	if err == nil {
		t.Errorf("Release by a holder whose lock was taken away on the server returned nil; it must say the lock was lost")
	} else {
		if !errors.Is(err, locker.ErrLost) {
			t.Errorf("Release by a holder whose lock was taken away: %v, want an error wrapping locker.ErrLost", err)
		}
		checkKeyError(t, err, k, "Release by a robbed holder")
	}
	if err := next.Err(); err != nil {
		t.Errorf("new holder's Err() = %v after the robbed holder's Release, want nil", err)
	}
	mustNotTry(t, ctx, c, k, "the new holder must keep it after the robbed holder's Release (a release that does not compare owners deletes it)")
	mustRelease(t, ctx, next)
}

// stealRenewalDoesNotExtend: the robbed holder's renewals must not extend
// the new holder's lock. The new holder crashes; its lease must run out
// within the expiry bound although the robbed holder keeps running.
func (s *suite) stealRenewalDoesNotExtend(t *testing.T, ctx context.Context) {
	s.needSteal(t)
	s.needCrash(t)
	a, b, c := s.newLocker(t), s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	robbed, next := s.steal(t, ctx, a, b, k)
	s.h.Crash(t, b)
	crashed := time.Now()
	mustRelease(t, ctx, s.awaitAfterFault(t, goAcquire(ctx, c, k), crashed, next,
		"the holder after a steal crashed (does the robbed holder's renewal extend the new holder's lock?)"))
	// The robbed holder may not have heard yet: where the server frees
	// the crashed holder's lock at once (a session that ends), all of the
	// above can take less time than the robbed holder's watcher needs to
	// run on a loaded machine. It must hear within LossBound
	// (stealLossReported times that; here it is only checked).
	select {
	case <-robbed.Done():
	case <-time.After(s.h.LossBound + s.h.CtxSlack):
	}
	if err := robbed.Err(); !errors.Is(err, locker.ErrLost) {
		t.Errorf("robbed holder's Err() = %v after another client held and lost the key, want an error wrapping locker.ErrLost", err)
	}
}

// stealLossReported: the robbed holder hears of the loss within LossBound.
func (s *suite) stealLossReported(t *testing.T, ctx context.Context) {
	s.needSteal(t)
	a := s.newLocker(t)
	k := key(t, "")
	h := mustAcquire(t, ctx, a, k, ttl(s))
	s.h.Steal(t, h)
	stolen := time.Now()
	select {
	case <-h.Done():
		t.Logf("loss reported %v after the lock was taken away (bound %v)", time.Since(stolen), s.h.LossBound)
	case <-time.After(s.h.LossBound + s.h.CtxSlack):
		t.Fatalf("a holder whose lock was taken away on the server did not report it within LossBound %v", s.h.LossBound)
	}
	if err := h.Err(); !errors.Is(err, locker.ErrLost) {
		t.Errorf("Err() of a holder whose lock was taken away = %v, want an error wrapping locker.ErrLost", err)
	} else {
		checkKeyError(t, err, k, "Err() of a robbed holder")
	}
}

// stealOthersKept: one Locker holds several locks, taken together so that
// their renewals come due together (a backend that renews many locks in
// one request puts them in one batch); one of them is taken away. Its
// holder hears of the loss within LossBound, and the others stay held past
// the end of the lease they had when it did (a renewal whose verdict is the
// batch's, not each lock's, ends them all, at once or at the end of their
// lease), and their Releases succeed.
func (s *suite) stealOthersKept(t *testing.T, ctx context.Context) {
	s.needSteal(t)
	a := s.newLocker(t)
	const n = 6
	hs := make([]locker.Handle, n)
	for i := range hs {
		hs[i] = mustAcquire(t, ctx, a, key(t, fmt.Sprint(i)), ttl(s))
	}
	robbed := hs[n/2]
	s.h.Steal(t, robbed)
	stolen := time.Now()
	select {
	case <-robbed.Done():
	case <-time.After(s.h.LossBound + s.h.CtxSlack):
		t.Fatalf("a holder whose lock was taken away on the server did not report it within LossBound %v", s.h.LossBound)
	}
	t.Logf("loss reported %v after the lock was taken away", time.Since(stolen))
	// Past the lease the others had when the loss was found: they must
	// have been renewed meanwhile.
	lease := s.h.TTL
	if lease <= 0 {
		lease = locker.DefaultTTL
	}
	ended := make(chan int, n)
	for i, h := range hs {
		if h != robbed {
			go func() { <-h.Done(); ended <- i }()
		}
	}
	select {
	case i := <-ended:
		t.Fatalf("lock %d of %d ended with %v when another lock of its Locker was taken away: each lock's renewal must be judged on its own", i, n, hs[i].Err())
	case <-time.After(lease + s.h.CtxSlack):
	}
	for i, h := range hs {
		if h == robbed {
			continue
		}
		if err := h.Release(ctx); err != nil {
			t.Errorf("Release of lock %d, held while another lock of its Locker was taken away: %v", i, err)
		}
	}
}
