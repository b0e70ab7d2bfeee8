package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// The Inspect cases run when the backend's Locker implements
// locker.Inspector: its answers must match what the suite did.

func (s *suite) inspector(t *testing.T, l locker.Locker) locker.Inspector {
	t.Helper()
	in, ok := l.(locker.Inspector)
	if !ok {
		t.Skip("conformance: the Locker does not implement locker.Inspector")
	}
	return in
}

func mustInspect(t *testing.T, ctx context.Context, in locker.Inspector, k string) locker.LockInfo {
	t.Helper()
	info, err := in.Inspect(ctx, k)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", truncate(k), err)
	}
	if info.Key != k {
		t.Errorf("Inspect(%q).Key = %q", truncate(k), truncate(info.Key))
	}
	return info
}

// inspectLifecycle: not held before, held with the holder's token and a
// lease no longer than its TTL while held (seen from another Locker), not
// held after Release; Inspect itself takes nothing.
func (s *suite) inspectLifecycle(t *testing.T, ctx context.Context) {
	a, b := s.newLocker(t), s.newLocker(t)
	in := s.inspector(t, b)
	k := key(t, "")
	if info := mustInspect(t, ctx, in, k); info.Held || info.Token != 0 || info.TTL != 0 {
		t.Fatalf("Inspect of a key never taken: %+v, want not held, token 0, TTL 0", info)
	}
	h := mustAcquire(t, ctx, a, k, ttl(s))
	info := mustInspect(t, ctx, in, k)
	if !info.Held || info.Token != h.Token() {
		t.Errorf("Inspect while held (token %d): %+v, want held with that token", h.Token(), info)
	}
	if info.TTL < 0 || info.TTL > s.h.TTL {
		t.Errorf("Inspect while held: TTL %v, want between 0 and the lock's TTL %v", info.TTL, s.h.TTL)
	}
	// Inspecting must not take or disturb the lock.
	if _, err := b.TryAcquire(ctx, k, ttl(s)); !errors.Is(err, locker.ErrNotAcquired) {
		t.Errorf("TryAcquire after Inspect of a held key: %v, want ErrNotAcquired", err)
	}
	if h.Err() != nil {
		t.Fatalf("holder's lock ended after Inspect: %v", h.Err())
	}
	mustRelease(t, ctx, h)
	if info := mustInspect(t, ctx, in, k); info.Held || info.Token != 0 {
		t.Errorf("Inspect after Release: %+v, want not held", info)
	}
	// The key is free: Inspect left nothing behind.
	h2 := mustAcquire(t, ctx, b, k, ttl(s))
	mustRelease(t, ctx, h2)
}

// inspectAfterCrash: a holder that crashed (nothing renews its lock) shows
// as not held once its lease has run out.
func (s *suite) inspectAfterCrash(t *testing.T, ctx context.Context) {
	s.needCrash(t)
	a, b := s.newLocker(t), s.newLocker(t)
	in := s.inspector(t, b)
	k := key(t, "")
	h := mustAcquire(t, ctx, a, k, ttl(s))
	s.h.Crash(t, a)
	deadline := time.Now().Add(s.h.ExpiryBound + prompt)
	for {
		info := mustInspect(t, ctx, in, k)
		if !info.Held {
			break
		}
		if info.Token != h.Token() {
			t.Fatalf("Inspect after the holder crashed: %+v, want the crashed holder's token %d or not held", info, h.Token())
		}
		if time.Now().After(deadline) {
			t.Fatalf("Inspect still shows the key held %v after its holder crashed (ExpiryBound %v)", s.h.ExpiryBound+prompt, s.h.ExpiryBound)
		}
		// Polling is the point here: Inspect is what an operator polls.
		select {
		case <-time.After(s.h.TTL / 10):
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
}

// inspectBadKey: an invalid key is refused with ErrInvalidKey, as by
// Acquire.
func (s *suite) inspectBadKey(t *testing.T, ctx context.Context) {
	in := s.inspector(t, s.newLocker(t))
	if _, err := in.Inspect(ctx, ""); !errors.Is(err, locker.ErrInvalidKey) {
		t.Errorf("Inspect(\"\") = %v, want an error wrapping ErrInvalidKey", err)
	}
}
