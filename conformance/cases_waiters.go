package conformance

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// waiterFault: holder H, waiters W1 and W2 on Lockers of their own. W1 is
// cancelled, cut off or crashes (fault) while both wait; W2 still waits
// while H holds (until W1's claim has surely ended); H releases; W2
// holds the key within bound of the release. A fault on one waiter must not
// strand the others (a queue entry that nobody will ever act on, a wake-up
// spent on a waiter that is gone), and a cut waiter whose wait ended must not
// end up holding a lock it cannot see.
func (s *suite) waiterFault(t *testing.T, ctx context.Context, fault string) {
	h, w1, w2 := s.newLocker(t), s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	hh := mustAcquire(t, ctx, h, k) // the default TTL: only a release or a wake-up frees it soon
	w1ctx, w1cancel := context.WithCancel(ctx)
	defer w1cancel()
	ch1 := goAcquire(w1ctx, w1, k, ttl(s))
	stillWaiting(t, ch1, "first waiter")
	ch2 := goAcquire(ctx, w2, k, ttl(s))
	stillWaiting(t, ch2, "second waiter")
	bound := s.h.HandoffBound
	heal := func() {}
	faulted := time.Now()
	switch fault {
	case "cancel":
		w1cancel()
		r := await(t, ch1, s.h.CtxSlack+prompt, "cancelled waiter")
		if r.err == nil {
			_ = r.h.Release(ctx)
			t.Fatal("a waiter whose context was cancelled acquired the key while another client held it")
		}
	case "cut":
		heal = s.cut(t, w1)
		defer heal()
		// A waiter cut off may have left a claim on the server (a queue
		// entry) that only its session's end removes.
		bound = s.h.ExpiryBound + s.h.HandoffBound
	case "crash":
		s.h.Crash(t, w1)
		bound = s.h.ExpiryBound + s.h.HandoffBound
	}
	// The holder still holds: whatever the first waiter's fault does on the
	// server (its queue entry removed, its session expired, a watch fired),
	// the second waiter must still wait. A cut or crashed waiter's claim
	// ends within ExpiryBound, so watch that long.
	watch := quick
	if fault != "cancel" {
		watch = s.h.ExpiryBound
	}
	select {
	case r := <-ch2:
		if r.err == nil {
			_ = r.h.Release(ctx)
			t.Fatalf("second waiter acquired the key %v after the first waiter %s, while the holder still held it (holder's Err: %v)", time.Since(faulted).Round(time.Millisecond), faultPast[fault], hh.Err())
		}
		t.Fatalf("second waiter failed after the first waiter %s, while the holder held the key: %v", faultPast[fault], r.err)
	case <-hh.Done():
		t.Fatalf("the holder lost its lock while the first waiter %s: %v", faultPast[fault], hh.Err())
	case <-time.After(watch):
	}
	released := time.Now()
	mustRelease(t, ctx, hh)
	r := await(t, ch2, bound+prompt, "second waiter after the holder released")
	if r.err != nil {
		t.Fatalf("second waiter after the holder released (the first waiter %s): %v", faultPast[fault], r.err)
	}
	took := r.at.Sub(released)
	t.Logf("second waiter held the key %v after the release (the first waiter %s; bound %v)", took, faultPast[fault], bound)
	if took > bound {
		t.Errorf("second waiter held the key %v after the release, more than %v: the first waiter %s and stranded it", took, bound, faultPast[fault])
	}
	if r.h.Token() <= hh.Token() {
		t.Errorf("second waiter's token %d is not greater than the holder's %d", r.h.Token(), hh.Token())
	}
	if fault == "cut" {
		// End W1's wait, heal it: it must not have taken the key, and must
		// not believe it holds it.
		w1cancel()
		r1 := await(t, ch1, s.h.CtxSlack+prompt, "cut-off waiter whose context was cancelled")
		heal()
		if r1.err == nil {
			if isClosed(r1.h.Done()) {
				t.Logf("cut-off waiter returned a handle already ended: %v", r1.h.Err())
			} else {
				t.Errorf("a cut-off waiter holds the key (Done open) while the second waiter holds it too")
			}
			_ = r1.h.Release(ctx)
		}
		mustNotTry(t, ctx, w1, k, "the second waiter holds it (after the first, cut-off waiter healed)")
	}
	mustRelease(t, ctx, r.h)
}

var faultPast = map[string]string{"cancel": "was cancelled", "cut": "was cut off", "crash": "crashed"}

func (s *suite) waiterCancelled(t *testing.T, ctx context.Context) { s.waiterFault(t, ctx, "cancel") }

func (s *suite) waiterCut(t *testing.T, ctx context.Context) {
	s.needCut(t)
	s.waiterFault(t, ctx, "cut")
}

func (s *suite) waiterCrashes(t *testing.T, ctx context.Context) {
	s.needCrash(t)
	s.waiterFault(t, ctx, "crash")
}

// waitersMany: several waiters, some sharing a Locker, and repeated
// releases: each round exactly one waiter holds the key within HandoffBound
// of the release, until every waiter has had it. A backend that wakes only
// one waiter per release, and loses the wake-up when that waiter loses the
// race or has already gone, strands the others.
func (s *suite) waitersMany(t *testing.T, ctx context.Context) {
	const lockers, perLocker = 3, 2
	ls := make([]locker.Locker, lockers)
	for i := range ls {
		ls[i] = s.newLocker(t)
	}
	holderL := s.newLocker(t)
	k := key(t, "")
	holder := mustAcquire(t, ctx, holderL, k)
	res := make(chan result, lockers*perLocker)
	for i := range lockers * perLocker {
		l := ls[i%lockers]
		go func() {
			h, err := l.Acquire(ctx, k)
			res <- result{h, err, time.Now()}
		}()
	}
	stillWaiting(t, res, "waiters of a held key")
	var handoffs []time.Duration
	for round := range lockers * perLocker {
		released := time.Now()
		prevTok := holder.Token()
		mustRelease(t, ctx, holder)
		r := await(t, res, s.h.HandoffBound+prompt, "a waiter after the release")
		if r.err != nil {
			t.Fatalf("round %d: a waiter: %v", round, r.err)
		}
		handoffs = append(handoffs, r.at.Sub(released))
		if r.h.Token() <= prevTok {
			t.Errorf("round %d: token %d not greater than the previous holder's %d", round, r.h.Token(), prevTok)
		}
		// Exactly one: no other waiter returns while this one holds.
		select {
		case r2 := <-res:
			if r2.err == nil {
				_ = r2.h.Release(ctx)
				t.Fatalf("round %d: two waiters hold the key at once", round)
			}
			t.Fatalf("round %d: a waiter failed: %v", round, r2.err)
		case <-time.After(50 * time.Millisecond):
		}
		holder = r.h
	}
	mustRelease(t, ctx, holder)
	slices.Sort(handoffs)
	t.Logf("handoffs to %d waiters: %v", len(handoffs), handoffs)
	if worst := handoffs[len(handoffs)-1]; worst > s.h.HandoffBound {
		t.Errorf("a waiter held the key only %v after the release, more than HandoffBound %v: was its wake-up lost?", worst, s.h.HandoffBound)
	}
}

// shortCutKeepsLock: a cut shorter than a third of the TTL, healed, costs
// nothing: the lock is kept (Done stays open, others stay refused) for two
// TTLs after.
func (s *suite) shortCutKeepsLock(t *testing.T, ctx context.Context) {
	s.needCut(t)
	a, b := s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	h := mustAcquire(t, ctx, a, k, ttl(s))
	heal := s.cut(t, a)
	time.Sleep(s.h.TTL / 4) // the fault itself: a partition of this length
	heal()
	until := time.Now().Add(2 * s.h.TTL)
	for time.Now().Before(until) {
		if isClosed(h.Done()) {
			t.Fatalf("a holder cut off for TTL/4 (%v) and healed lost its lock: %v", s.h.TTL/4, h.Err())
		}
		mustNotTry(t, ctx, b, k, "its holder was cut off only briefly, then healed")
		select {
		case <-h.Done():
		case <-time.After(s.h.TTL / 4):
		}
	}
	mustRelease(t, ctx, h)
}

// closeWhileInFlight: Close of a Locker whose Acquire is in flight (the
// client is cut off, so the request hangs) returns promptly, and the
// Acquire ends with ErrClosed.
func (s *suite) closeWhileInFlight(t *testing.T, ctx context.Context) {
	s.needCut(t)
	a := s.newLocker(t)
	k := key(t, "")
	heal := s.cut(t, a)
	defer heal()
	ch := goAcquire(ctx, a, k, ttl(s))
	select {
	case r := <-ch:
		switch {
		case r.err == nil:
			_ = r.h.Release(ctx)
			t.Fatal("Acquire by a client cut off from the backend succeeded")
		case errors.Is(r.err, locker.ErrNotAcquired):
			t.Fatalf("Acquire by a client cut off from the backend: %v; ErrNotAcquired means another holder has the key", r.err)
		}
		t.Skipf("conformance: the backend fails calls at once while cut off (%v), so no request is in flight for Close to interrupt; a Cut that blackholes would run this case", r.err)
	case <-time.After(200 * time.Millisecond):
	}
	start := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	select {
	case err := <-closed:
		t.Logf("Close with an Acquire in flight returned after %v: %v", time.Since(start), err)
	case <-time.After(s.h.CtxSlack + prompt):
		t.Fatalf("Close with an Acquire in flight (client cut off) had not returned after %v", s.h.CtxSlack+prompt)
	}
	if took := time.Since(start); took > s.h.CtxSlack+quick {
		t.Errorf("Close with an Acquire in flight took %v; it must interrupt the request, not wait for it", took)
	}
	r := await(t, ch, s.h.CtxSlack+prompt, "Acquire in flight when its Locker closed")
	if r.err == nil {
		t.Fatal("Acquire in flight when its Locker closed succeeded")
	}
	if !errors.Is(r.err, locker.ErrClosed) {
		t.Errorf("Acquire in flight when its Locker closed: %v, want an error wrapping locker.ErrClosed", r.err)
	}
	if late := r.at.Sub(start); late > s.h.CtxSlack+quick {
		t.Errorf("Acquire in flight returned %v after Close; Close must end it at once", late)
	}
}

// waiterLapses: Curator's killed-session test, for a Locker that holds one
// key and waits for another. A holds k1 and waits for k2, which B holds; A
// is cut off until its lease or session must have lapsed on the server
// (ExpiryBound), then healed; B releases k2. A's k1 must be lost, and A's
// wait for k2 must end on its own, not only when its ctx does: A either
// holds k2 within ExpiryBound + HandoffBound of B's release (really holds
// it: Done open, others refused, a greater token) or its Acquire has failed
// with an error. A waiter stranded on a claim its lapsed session lost (a
// queue node gone with the session, a watch on a predecessor that will
// never fire) fails this case.
func (s *suite) waiterLapses(t *testing.T, ctx context.Context) {
	s.needCut(t)
	a, b, c := s.newLocker(t), s.newLocker(t), s.newLocker(t)
	k1, k2 := key(t, "-held"), key(t, "-waited")
	h1 := mustAcquire(t, ctx, a, k1, ttl(s))
	h2 := mustAcquire(t, ctx, b, k2, ttl(s))
	ch := goAcquire(ctx, a, k2, ttl(s))
	stillWaiting(t, ch, "waiter for a held key")
	heal := s.cut(t, a)
	defer heal()
	cut := time.Now()
	waitDone(t, h1, s.h.ExpiryBound+prompt, "holder cut off")
	if err := h1.Err(); !errors.Is(err, locker.ErrLost) {
		t.Errorf("Err() of a holder cut off past its lease = %v, want an error wrapping locker.ErrLost", err)
	}
	// The fault itself: keep A cut off until its lease or session has
	// surely lapsed on the server.
	select {
	case r := <-ch:
		ch = nil
		if r.err == nil {
			_ = r.h.Release(ctx)
			t.Fatalf("a waiter cut off from the backend acquired a key that another client holds")
		}
		t.Logf("the cut-off waiter failed on its own while cut off: %v", r.err)
	case <-time.After(time.Until(cut.Add(s.h.ExpiryBound))):
	}
	heal()
	released := time.Now()
	mustRelease(t, ctx, h2)
	if ch == nil {
		return
	}
	r := await(t, ch, s.h.ExpiryBound+s.h.HandoffBound+prompt, "the waiter whose lease or session lapsed, after the holder released")
	if r.err != nil {
		t.Logf("the waiter whose lease or session lapsed failed %v after the release: %v", r.at.Sub(released).Round(time.Millisecond), r.err)
		return
	}
	t.Logf("the waiter whose lease or session lapsed held the key %v after the release", r.at.Sub(released).Round(time.Millisecond))
	if isClosed(r.h.Done()) {
		t.Errorf("the waiter whose lease or session lapsed returned a handle already ended: %v", r.h.Err())
	} else {
		mustNotTry(t, ctx, c, k2, "the waiter whose lease or session lapsed says it holds it")
	}
	if r.h.Token() <= h2.Token() {
		t.Errorf("token %d of the waiter whose lease or session lapsed is not greater than the previous holder's %d", r.h.Token(), h2.Token())
	}
	_ = r.h.Release(ctx)
}
