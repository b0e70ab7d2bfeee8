package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// connectionsReset: a Locker holding a few keys has every connection to the
// backend closed under it (Harness.Reset). Each lock either survives (its
// handle stays open and others stay refused) or is reported lost no later
// than another client can take its key: never a silent second holder. (For
// a backend whose locks end with their connection, just after: see
// Harness.ResetEndsLocks.) The Locker itself recovers: it takes a new key
// at once.
func (s *suite) connectionsReset(t *testing.T, ctx context.Context) {
	if s.h.Reset == nil {
		t.Skip("conformance: needs Harness.Reset")
	}
	const n = 3
	l, c := s.newLocker(t), s.newLocker(t)
	var keys [n]string
	var hs [n]locker.Handle
	for i := range n {
		keys[i] = key(t, "-"+itoa(i))
		hs[i] = mustAcquire(t, ctx, l, keys[i], ttl(s))
	}
	s.h.Reset(t, l)
	reset := time.Now()
	taken := make([]bool, n)
	watch := max(2*s.h.TTL, s.h.ExpiryBound)
	for time.Since(reset) < watch {
		for i := range n {
			if taken[i] {
				continue
			}
			h, err := c.TryAcquire(ctx, keys[i], ttl(s))
			switch {
			case err == nil:
				taken[i] = true
				if !isClosed(hs[i].Done()) {
					if s.h.ResetEndsLocks == "" {
						t.Errorf("key %d: another client took it %v after its holder's connections were reset, while the holder's Done() was still open: a silent second holder", i, time.Since(reset).Round(time.Millisecond))
					} else {
						s.awaitResetNotice(t, i, hs[i], reset)
					}
				}
				if isClosed(hs[i].Done()) {
					if err := hs[i].Err(); !errors.Is(err, locker.ErrLost) {
						t.Errorf("key %d: taken by another client after its holder's connections were reset; the holder's Err() = %v, want an error wrapping locker.ErrLost", i, err)
					}
				}
				if h.Token() <= hs[i].Token() {
					t.Errorf("key %d: token %d of the next holder is not greater than %d", i, h.Token(), hs[i].Token())
				}
				_ = h.Release(ctx)
			case !errors.Is(err, locker.ErrNotAcquired):
				t.Fatalf("key %d: TryAcquire by another client: %v", i, err)
			}
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(s.h.TTL / 4):
		}
	}
	survived := 0
	for i := range n {
		switch {
		case taken[i]:
		case isClosed(hs[i].Done()):
			if err := hs[i].Err(); !errors.Is(err, locker.ErrLost) {
				t.Errorf("key %d: ended after its holder's connections were reset with Err() = %v, want an error wrapping locker.ErrLost", i, err)
			}
		default:
			survived++
			mustRelease(t, ctx, hs[i])
		}
	}
	t.Logf("%d of %d locks survived the reset of their Locker's connections; the others were reported lost", survived, n)
	// The Locker works on new connections.
	tctx, cancel := context.WithTimeout(ctx, s.h.ExpiryBound+prompt)
	defer cancel()
	h, err := l.TryAcquire(tctx, key(t, "-after"), ttl(s))
	if err != nil {
		t.Fatalf("TryAcquire of a free key by a Locker whose connections were reset: %v", err)
	}
	mustRelease(t, ctx, h)
}

// resetNotice bounds how long after another client took a key that a reset
// freed (Harness.ResetEndsLocks) its holder may still be unaware: the
// notice comes from the same break that freed the lock, so this is a
// wake-up on a loaded machine, not a check on a timer (a Locker that
// finds out by its next renewal or health check fails).
const resetNotice = 250 * time.Millisecond

// awaitResetNotice waits for the loss notice of h, whose key another client
// took after the reset of h's connections freed it on the server
// (Harness.ResetEndsLocks): within resetNotice.
func (s *suite) awaitResetNotice(t *testing.T, i int, h locker.Handle, reset time.Time) {
	t.Helper()
	taken := time.Now()
	select {
	case <-h.Done():
		t.Logf("key %d: taken by another client %v after the reset, its holder's loss reported %v after that (the backend's locks end with their connection: %s)",
			i, taken.Sub(reset).Round(time.Millisecond), time.Since(taken).Round(time.Millisecond), s.h.ResetEndsLocks)
	case <-time.After(resetNotice):
		t.Errorf("key %d: another client took it %v after its holder's connections were reset, and the holder's Done() was still open %v after that: a silent second holder (the backend's locks end with their connection, and its holder must hear of it from the same break)",
			i, taken.Sub(reset).Round(time.Millisecond), resetNotice)
	}
}
