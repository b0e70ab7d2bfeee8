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

// multiAllOrNothing: TryAcquireAll of keys one of which is held fails with
// ErrNotAcquired naming that key, and leaves the others free; once the key
// is free, it takes them all, each handle with its key and token.
func (s *suite) multiAllOrNothing(t *testing.T, ctx context.Context) {
	a, b := s.newLocker(t), s.newLocker(t)
	base := key(t, "")
	keys := []string{base + "/c", base + "/a", base + "/b"}
	held := mustTry(t, ctx, a, keys[2])
	m, err := locker.TryAcquireAll(ctx, b, keys)
	if err == nil {
		_ = m.Release(ctx)
		t.Fatalf("TryAcquireAll succeeded although %q is held", keys[2])
	}
	if !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll with %q held: %v, want an error wrapping locker.ErrNotAcquired", keys[2], err)
	}
	checkKeyError(t, err, keys[2], "TryAcquireAll with one key held")
	for _, k := range []string{keys[0], keys[1]} {
		mustRelease(t, ctx, mustTry(t, ctx, a, k)) // left free
	}
	mustRelease(t, ctx, held)
	m, err = locker.TryAcquireAll(ctx, b, keys)
	if err != nil {
		t.Fatalf("TryAcquireAll of free keys: %v", err)
	}
	got := m.Keys()
	want := []string{keys[1], keys[2], keys[0]} // ascending
	for i := range want {
		if i >= len(got) || got[i] != want[i] {
			t.Fatalf("Multi.Keys() = %q, want %q (ascending)", got, want)
		}
	}
	for _, h := range m.Handles() {
		checkHeld(t, h, h.Key())
		if m.Token(h.Key()) != h.Token() {
			t.Errorf("Multi.Token(%q) = %d, want its handle's %d", h.Key(), m.Token(h.Key()), h.Token())
		}
		mustNotTry(t, ctx, a, h.Key(), "a Multi holds it")
	}
	if err := m.Release(ctx); err != nil {
		t.Fatalf("Multi.Release: %v", err)
	}
	if err := m.Err(); !errors.Is(err, locker.ErrReleased) {
		t.Errorf("Multi.Err() after Release = %v, want locker.ErrReleased", err)
	}
	if err := m.Release(ctx); !errors.Is(err, locker.ErrReleased) {
		t.Errorf("second Multi.Release = %v, want an error wrapping locker.ErrReleased", err)
	}
	for _, k := range keys {
		mustRelease(t, ctx, mustTry(t, ctx, a, k))
	}
}

// multiOppositeOrders: callers that name the same keys in opposite orders
// take them over and over without deadlock, and never hold them together.
func (s *suite) multiOppositeOrders(t *testing.T, ctx context.Context) {
	k1, k2, k3 := key(t, "/1"), key(t, "/2"), key(t, "/3")
	orders := [][]string{{k1, k2, k3}, {k3, k2, k1}, {k2, k3, k1}}
	var inside, overlaps atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, len(orders))
	for _, keys := range orders {
		l := s.newLocker(t)
		wg.Go(func() {
			for range 8 {
				err := locker.DoAll(ctx, l, keys, func(ctx context.Context, m *locker.Multi) error {
					if inside.Add(1) != 1 {
						overlaps.Add(1)
					}
					time.Sleep(time.Millisecond)
					inside.Add(-1)
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("DoAll with the keys in another order: %v (a deadlock ends with the case's deadline)", err)
	}
	if n := overlaps.Load(); n > 0 {
		t.Errorf("two Multis held the same keys at once %d time(s)", n)
	}
}

// multiWaitCancelled: an AcquireAll that waits for its last key gives back
// the keys it took when its ctx ends.
func (s *suite) multiWaitCancelled(t *testing.T, ctx context.Context) {
	a, b := s.newLocker(t), s.newLocker(t)
	k1, k2 := key(t, "/1"), key(t, "/2")
	held := mustTry(t, ctx, a, k2)
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	m, err := locker.AcquireAll(cctx, b, []string{k2, k1})
	if err == nil {
		_ = m.Release(ctx)
		t.Fatalf("AcquireAll got %q although another holder has it", k2)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("AcquireAll whose ctx ended while waiting: %v, want an error wrapping context.DeadlineExceeded", err)
	}
	mustRelease(t, ctx, mustTry(t, ctx, a, k1)) // given back
	mustRelease(t, ctx, held)
}

// multiLoss: when one lock of a Multi is lost, its Done closes and Err
// wraps ErrLost; Release still releases the others and reports the loss.
func (s *suite) multiLoss(t *testing.T, ctx context.Context) {
	if s.h.Steal == nil {
		t.Skip("conformance: Harness.Steal is not set")
	}
	a, b := s.newLocker(t), s.newLocker(t)
	k1, k2 := key(t, "/1"), key(t, "/2")
	m, err := locker.AcquireAll(ctx, a, []string{k1, k2}, ttl(s))
	if err != nil {
		t.Fatalf("AcquireAll: %v", err)
	}
	s.h.Steal(t, m.Handles()[1])
	select {
	case <-m.Done():
	case <-time.After(s.h.LossBound + prompt):
		t.Fatalf("Multi.Done() not closed within %v of one of its locks being taken away", s.h.LossBound+prompt)
	}
	if err := m.Err(); !errors.Is(err, locker.ErrLost) {
		t.Errorf("Multi.Err() after a loss = %v, want an error wrapping locker.ErrLost", err)
	}
	if err := m.Release(ctx); !errors.Is(err, locker.ErrLost) {
		t.Errorf("Multi.Release after a loss = %v, want an error wrapping locker.ErrLost", err)
	}
	mustRelease(t, ctx, mustTry(t, ctx, b, k1)) // the other lock was released
}

// multiBadKeys: no keys, a key named twice and an invalid key are refused
// with ErrInvalidKey, and nothing is taken.
func (s *suite) multiBadKeys(t *testing.T, ctx context.Context) {
	l := s.newLocker(t)
	k := key(t, "")
	for name, keys := range map[string][]string{"no keys": nil, "a key twice": {k, k}, "an empty key": {k, ""}} {
		if m, err := locker.TryAcquireAll(ctx, l, keys); !errors.Is(err, locker.ErrInvalidKey) {
			if err == nil {
				_ = m.Release(ctx)
			}
			t.Errorf("TryAcquireAll with %s: %v, want an error wrapping locker.ErrInvalidKey", name, err)
		}
	}
	mustRelease(t, ctx, mustTry(t, ctx, l, k))
}
