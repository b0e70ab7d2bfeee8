package conformance

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/go-locker/locker"
)

// The token base (see locker.MaxTokenBase): a Locker with base n hands out
// n + the backend's own token, and reports the same in Inspect.

// tokenBaseOpener returns how the suite makes a Locker with a token base:
// Harness.NewLockerWithTokenBase, else Harness.URL with the shared
// parameter token_base. It skips the case when the harness has neither.
func (s *suite) tokenBaseOpener(t *testing.T) func(t *testing.T, ctx context.Context, n int64) (locker.Locker, error) {
	t.Helper()
	if s.h.NewLockerWithTokenBase != nil {
		return func(t *testing.T, _ context.Context, n int64) (locker.Locker, error) {
			l, err := s.h.NewLockerWithTokenBase(t, n)
			if err == nil && l == nil {
				t.Fatal("conformance: Harness.NewLockerWithTokenBase returned neither a Locker nor an error")
			}
			return l, err
		}
	}
	if s.h.URL == "" {
		t.Skip("conformance: neither Harness.NewLockerWithTokenBase nor Harness.URL is set; set one to check the token base (WithTokenBase, token_base)")
	}
	u := s.needURL(t)
	return func(t *testing.T, ctx context.Context, n int64) (locker.Locker, error) {
		v := *u
		q := v.Query()
		if n != 0 {
			q.Set("token_base", strconv.FormatInt(n, 10))
		}
		v.RawQuery = q.Encode()
		return locker.Open(ctx, v.String())
	}
}

// fencingTokenBase: every token of a Locker with token base n is above n,
// and n plus the token the backend gives a Locker without a base (the
// rule is an offset), so tokens still strictly increase across holders,
// with or without the base; Inspect from a Locker with base n reports n
// plus the backend's token, so it agrees with the holder's Handle.Token
// when both have the same base. A base below 0 or above
// locker.MaxTokenBase is refused. The base is locker.MaxTokenBase itself:
// above every backend's own tokens, so that a Locker that ignores the base
// cannot pass, and where a sum that overflowed would show.
func (s *suite) fencingTokenBase(t *testing.T, ctx context.Context) {
	open := s.tokenBaseOpener(t)
	const base = locker.MaxTokenBase
	mustOpen := func(n int64) locker.Locker {
		t.Helper()
		l, err := open(t, ctx, n)
		if err != nil {
			t.Fatalf("a Locker with token base %d: %v", n, err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	// Lockers 0 and 1 have the base, 2 has none: the same keyspace.
	ls := []locker.Locker{mustOpen(base), mustOpen(base), mustOpen(0)}
	bases := []int64{base, base, 0}
	k := key(t, "")
	var prev int64 // the previous holder's token less its base
	for i, who := range []int{0, 1, 2, 0, 2, 1, 0} {
		var h locker.Handle
		if i%2 == 0 {
			h = mustAcquire(t, ctx, ls[who], k)
		} else {
			h = mustTry(t, ctx, ls[who], k)
		}
		tok, b := h.Token(), bases[who]
		if b > 0 && tok <= b {
			t.Errorf("acquisition %d, by a Locker with token base %d: token %d is not above the base", i, b, tok)
			mustRelease(t, ctx, h)
			continue
		}
		// Without the base, the tokens are the backend's own: they must
		// increase across holders whatever the holders' bases.
		if own := tok - b; own <= prev {
			t.Errorf("acquisition %d, by a Locker with token base %d: token %d less the base is %d, not above the previous holder's %d (the token must be the base plus the backend's own token, which increases across holders)", i, b, tok, own, prev)
		} else {
			prev = own
		}
		// Every Locker's Inspect: its own base plus the backend's token,
		// which is the holder's Handle.Token for a Locker of the same base.
		for j, l := range ls {
			in, ok := l.(locker.Inspector)
			if !ok {
				continue
			}
			info := mustInspect(t, ctx, in, k)
			if want := tok - b + bases[j]; !info.Held || info.Token != want {
				t.Errorf("acquisition %d, by a Locker with token base %d (token %d): Inspect from a Locker with token base %d = held %v, token %d; want held, token %d",
					i, b, tok, bases[j], info.Held, info.Token, want)
			}
		}
		mustRelease(t, ctx, h)
	}

	for _, n := range []int64{-1, base + 1} {
		l, err := open(t, ctx, n)
		if err == nil {
			// A constructor that returns no error reports a bad option at
			// the first call.
			var h locker.Handle
			h, err = l.TryAcquire(ctx, key(t, "-refused"))
			if err == nil {
				_ = h.Release(ctx)
			}
			_ = l.Close()
		}
		if !errors.Is(err, locker.ErrInvalidOption) && !errors.Is(err, locker.ErrInvalidURL) {
			t.Errorf("token base %d (outside [0, locker.MaxTokenBase]): %v; want it refused with an error wrapping locker.ErrInvalidOption or ErrInvalidURL", n, err)
		}
	}
}
