package memlock

import (
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// Tests of the fault hooks (crash, cut) and of Close.

// TestExpiryEndsHolderBeforeHandoff: after a crash the key goes to the
// waiter when the lease runs out, and by then the old handle has reported
// the loss. The check is strict: the store ends it in the same step.
func TestExpiryEndsHolderBeforeHandoff(t *testing.T) {
	for _, fault := range []string{"crash", "cut"} {
		t.Run(fault, func(t *testing.T) {
			s := NewStore()
			a, b := newLocker(t, s), newLocker(t, s)
			const ttl = time.Second
			ha := mustAcquire(t, a, "k", locker.WithTTL(ttl))
			ch := goAcquire(testCtx(t), b, "k")
			waitQueued(t, s, "k", 1)
			switch fault {
			case "crash":
				a.crash()
			case "cut":
				t.Cleanup(a.cut())
			}
			r := await(t, ch, "waiter")
			if r.err != nil {
				t.Fatal(r.err)
			}
			if !isClosed(ha.Done()) || !errors.Is(ha.Err(), locker.ErrLost) {
				t.Fatalf("new holder exists but old handle: done=%v err=%v", isClosed(ha.Done()), ha.Err())
			}
			if since := time.Since(ha.(*handle).g.start); since < ttl {
				t.Fatalf("key handed over %v after the grant, before the %v lease could run out", since, ttl)
			}
			if r.h.Token() <= ha.Token() {
				t.Fatalf("token %d after expired token %d", r.h.Token(), ha.Token())
			}
		})
	}
}

func TestCrash(t *testing.T) {
	s := NewStore()
	a, b := newLocker(t, s), newLocker(t, s)
	ha := mustAcquire(t, a, "k", locker.WithTTL(time.Hour))
	held := newLocker(t, s)
	hw := mustAcquire(t, held, "w")
	waiting := goAcquire(testCtx(t), a, "w")
	waitQueued(t, s, "w", 1)

	a.crash()
	if r := await(t, waiting, "crashed Locker's waiter"); !errors.Is(r.err, locker.ErrClosed) {
		t.Fatalf("waiter of a crashed Locker: %v, want ErrClosed", r.err)
	}
	if _, err := b.TryAcquire(t.Context(), "k"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("a crash released the lock: TryAcquire = %v", err)
	}
	if ha.Err() != nil {
		t.Fatalf("handle of a crashed Locker ended before its lease: %v", ha.Err())
	}
	if _, err := a.TryAcquire(t.Context(), "x"); !errors.Is(err, locker.ErrClosed) {
		t.Fatalf("TryAcquire after crash: %v, want ErrClosed", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close after crash: %v", err)
	}
	if _, err := b.TryAcquire(t.Context(), "k"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("Close after crash released the lock: TryAcquire = %v", err)
	}
	if err := hw.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestCut(t *testing.T) {
	s := NewStore()
	a, b := newLocker(t, s), newLocker(t, s)
	// Long enough that the lease outlives the checks made while cut, even
	// on a loaded machine; the test waits for it to run out once.
	const ttl = time.Second
	ha := mustAcquire(t, a, "k", locker.WithTTL(ttl))
	hb := mustAcquire(t, b, "w")
	waiting := goAcquire(testCtx(t), a, "w")
	waitQueued(t, s, "w", 1)

	heal := a.cut()
	if r := await(t, waiting, "cut Locker's waiter"); !errors.Is(r.err, errUnreachable) {
		t.Fatalf("waiter of a cut Locker: %v, want errUnreachable", r.err)
	}
	if q := s.queued("w"); q != 0 {
		t.Fatalf("cut left %d waiter(s) in the queue", q)
	}
	if _, err := a.TryAcquire(t.Context(), "x"); !errors.Is(err, errUnreachable) {
		t.Fatalf("TryAcquire while cut: %v, want errUnreachable", err)
	}
	// Release cannot reach the store, but gives the lock up: the handle
	// ends at once, and the lease runs out in the store.
	if err := ha.Release(t.Context()); !errors.Is(err, errUnreachable) {
		t.Fatalf("Release while cut: %v, want errUnreachable", err)
	}
	if !isClosed(ha.Done()) || !errors.Is(ha.Err(), locker.ErrReleased) {
		t.Fatalf("after a Release while cut: done=%v err=%v, want ErrReleased", isClosed(ha.Done()), ha.Err())
	}
	if _, err := b.TryAcquire(t.Context(), "k"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("a Release while cut reached the store: TryAcquire = %v", err)
	}
	hb2 := mustAcquire(t, b, "k") // when the lease runs out
	if since := time.Since(ha.(*handle).g.start); since < ttl {
		t.Fatalf("key handed over %v after the grant, before the %v lease could run out", since, ttl)
	}

	heal()
	heal() // twice is fine
	if err := ha.Release(t.Context()); !errors.Is(err, locker.ErrReleased) {
		t.Fatalf("Release after a Release while cut: %v, want ErrReleased", err)
	}
	if _, err := a.TryAcquire(t.Context(), "k"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("a second Release freed another holder's key: TryAcquire = %v", err)
	}
	for _, h := range []locker.Handle{hb, hb2} {
		if err := h.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	// Healed: a works again.
	h := mustAcquire(t, a, "k")
	if err := h.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestCutAndHealInTimeKeepsLock: a cut shorter than the lease costs nothing.
func TestCutAndHealInTimeKeepsLock(t *testing.T) {
	s := NewStore()
	a := newLocker(t, s)
	const ttl = time.Second // see TestRenewalKeepsLockPastTTL
	h := mustAcquire(t, a, "k", locker.WithTTL(ttl))
	a.cut()()
	select {
	case <-h.Done():
		t.Fatalf("lost after a cut healed at once: %v", h.Err())
	case <-time.After(2 * ttl):
	}
	if err := h.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestClose(t *testing.T) {
	s := NewStore()
	a, b := newLocker(t, s), newLocker(t, s)
	ha := []locker.Handle{mustAcquire(t, a, "k1"), mustAcquire(t, a, "k2")}
	hb := mustAcquire(t, b, "k3")
	othersWait := goAcquire(testCtx(t), b, "k1")
	waitQueued(t, s, "k1", 1)
	ownWait := goAcquire(testCtx(t), a, "k3")
	waitQueued(t, s, "k3", 1)

	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	// Close returned, so everything below must already be true.
	if r := await(t, ownWait, "own waiter"); !errors.Is(r.err, locker.ErrClosed) {
		t.Fatalf("waiter of the closed Locker: %v, want ErrClosed", r.err)
	}
	for _, h := range ha {
		if !isClosed(h.Done()) || !errors.Is(h.Err(), locker.ErrReleased) || !errors.Is(h.Err(), locker.ErrClosed) {
			t.Fatalf("handle %q after Close: done=%v err=%v", h.Key(), isClosed(h.Done()), h.Err())
		}
		if err := h.Release(t.Context()); !errors.Is(err, locker.ErrReleased) {
			t.Fatalf("Release after Close: %v, want ErrReleased", err)
		}
	}
	r := await(t, othersWait, "other Locker's waiter")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if h, err := b.TryAcquire(t.Context(), "k2"); err != nil {
		t.Fatalf("k2 not released by Close: %v", err)
	} else {
		_ = h.Release(t.Context())
	}
	if _, err := a.Acquire(t.Context(), "z"); !errors.Is(err, locker.ErrClosed) {
		t.Fatalf("Acquire after Close: %v, want ErrClosed", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for _, h := range []locker.Handle{r.h, hb} {
		if err := h.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if s.entries() != 0 {
		t.Fatal("store keeps state after every lock was released")
	}
}

func TestCloseWhileCutLeavesLeasesToExpire(t *testing.T) {
	s := NewStore()
	a, b := newLocker(t, s), newLocker(t, s)
	h := mustAcquire(t, a, "k", locker.WithTTL(time.Second)) // outlives the checks below
	a.cut()
	if err := a.Close(); !errors.Is(err, errUnreachable) {
		t.Fatalf("Close while cut: %v, want an error saying locks were left", err)
	}
	if !errors.Is(h.Err(), locker.ErrLost) {
		t.Fatalf("handle after Close: %v", h.Err())
	}
	if _, err := b.TryAcquire(t.Context(), "k"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("a cut Locker released on Close: TryAcquire = %v", err)
	}
	h2 := mustAcquire(t, b, "k") // after the lease runs out
	_ = h2.Release(t.Context())
}
