package conformance

import (
	"context"
	"errors"
	"strings"
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

// ownerText is the owner description the Inspect/Owner case gives: the form
// the locker command uses, printable ASCII, shorter than every backend's
// limit for it (PostgreSQL's application_name: 63 bytes).
func ownerText(what string) string {
	return "host=conformance pid=4182 cmd=" + what
}

// inspectOwner: a lock taken with locker.WithOwner shows its holder's
// description in Inspect, taken by TryAcquire or by an Acquire that waited;
// a holder that gave none shows none (no earlier holder's description
// lingers); a bad description is refused with ErrInvalidOption and takes
// nothing.
func (s *suite) inspectOwner(t *testing.T, ctx context.Context) {
	a, b := s.newLocker(t), s.newLocker(t)
	in := s.inspector(t, b)
	if s.h.NoOwner != "" {
		t.Skipf("conformance: Harness.NoOwner: %s", s.h.NoOwner)
	}
	k := key(t, "")

	first := ownerText("first")
	h := mustTry(t, ctx, a, k, ttl(s), locker.WithOwner(first))
	if info := mustInspect(t, ctx, in, k); !info.Held || info.Owner != first {
		t.Errorf("Inspect of a lock taken by TryAcquire with WithOwner(%q): held %v, Owner %q; want held, that Owner", first, info.Held, info.Owner)
	}

	// A waiter given an owner: it shows once the key is handed to it.
	second := ownerText("second")
	ch := goAcquire(ctx, b, k, ttl(s), locker.WithOwner(second))
	stillWaiting(t, ch, "Acquire with WithOwner of a held key")
	mustRelease(t, ctx, h)
	r := await(t, ch, s.h.HandoffBound+prompt, "Acquire with WithOwner after the holder released")
	if r.err != nil {
		t.Fatalf("Acquire with WithOwner after the holder released: %v", r.err)
	}
	h2 := r.h
	if info := mustInspect(t, ctx, in, k); !info.Held || info.Token != h2.Token() || info.Owner != second {
		t.Errorf("Inspect of a lock taken by a waiting Acquire with WithOwner(%q) (token %d): held %v, token %d, Owner %q; want held, that token and Owner",
			second, h2.Token(), info.Held, info.Token, info.Owner)
	}
	mustRelease(t, ctx, h2)
	if info := mustInspect(t, ctx, in, k); info.Held || info.Owner != "" {
		t.Errorf("Inspect after Release: held %v, Owner %q; want not held, no Owner", info.Held, info.Owner)
	}

	// No owner given: none shown, not the last holder's.
	h3 := mustTry(t, ctx, a, k, ttl(s))
	if info := mustInspect(t, ctx, in, k); !info.Held || info.Owner != "" {
		t.Errorf("Inspect of a lock taken without WithOwner after holders that gave one: held %v, Owner %q; want held, no Owner", info.Held, info.Owner)
	}
	mustRelease(t, ctx, h3)

	// Bad descriptions are refused before anything is taken.
	bad := map[string]string{
		"too long":      strings.Repeat("x", locker.MaxOwnerLen+1),
		"newline":       "host=a\ncmd=b",
		"NUL":           "host=a\x00",
		"escape":        "\x1b[31mred",
		"invalid UTF-8": "host=\xff",
	}
	for what, o := range bad {
		for _, call := range []struct {
			name string
			fn   func(context.Context, string, ...locker.Option) (locker.Handle, error)
		}{{"TryAcquire", a.TryAcquire}, {"Acquire", a.Acquire}} {
			hb, err := call.fn(ctx, k, ttl(s), locker.WithOwner(o))
			if err == nil {
				_ = hb.Release(ctx)
				t.Errorf("%s with WithOwner(%s) succeeded; want an error wrapping ErrInvalidOption", call.name, what)
				continue
			}
			if !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), "owner") {
				t.Errorf("%s with WithOwner(%s) = %v; want an error wrapping ErrInvalidOption that names the owner", call.name, what, err)
			}
		}
	}
	if info := mustInspect(t, ctx, in, k); info.Held {
		t.Errorf("Inspect after refused acquisitions: %+v, want not held", info)
	}
	mustRelease(t, ctx, mustTry(t, ctx, b, k, ttl(s)))
}
