package backend_test

import (
	"errors"
	"math"
	"net/url"
	"strings"
	"testing"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// The token base is an offset: every token is base + the backend's own,
// within [0, locker.MaxTokenBase]; a sum past the int64 range is refused,
// never wrapped around.
func TestTokenBase(t *testing.T) {
	for _, c := range []struct {
		base, native, want int64
		ok                 bool
	}{
		{0, 1, 1, true},
		{1000, 1, 1001, true},
		{locker.MaxTokenBase, 1, locker.MaxTokenBase + 1, true},
		// The largest native token that still fits with the largest base.
		{locker.MaxTokenBase, math.MaxInt64 - locker.MaxTokenBase, math.MaxInt64, true},
		{locker.MaxTokenBase, math.MaxInt64 - locker.MaxTokenBase + 1, 0, false},
		{1, math.MaxInt64, 0, false},
		{5, 0, 0, false},
		{5, -3, 0, false},
	} {
		got, err := backend.BaseToken(c.base, c.native)
		switch {
		case c.ok && (err != nil || got != c.want):
			t.Errorf("BaseToken(%d, %d) = %d, %v; want %d", c.base, c.native, got, err, c.want)
		case !c.ok && (!errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), "token_base")):
			t.Errorf("BaseToken(%d, %d) = %d, %v; want an error wrapping ErrInvalidOption naming token_base", c.base, c.native, got, err)
		}
	}
	for _, n := range []int64{-1, locker.MaxTokenBase + 1, math.MaxInt64, math.MinInt64} {
		var s backend.Settings
		if err := backend.SetTokenBase(n)(&s); !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), "WithTokenBase") {
			t.Errorf("SetTokenBase(%d): %v; want an error wrapping ErrInvalidOption naming WithTokenBase", n, err)
		}
	}
	for _, n := range []int64{0, 1, locker.MaxTokenBase} {
		var s backend.Settings
		if err := backend.SetTokenBase(n)(&s); err != nil || s.TokenBase != n {
			t.Errorf("SetTokenBase(%d): %v, TokenBase %d", n, err, s.TokenBase)
		}
	}
}

func TestSharedTokenBase(t *testing.T) {
	read := func(query string) (backend.Settings, error) {
		q, err := backend.ParseQuery(&url.URL{Scheme: "x", RawQuery: query})
		if err != nil {
			return backend.Settings{}, err
		}
		var s backend.Settings
		for _, set := range q.Shared(nil) {
			if err := set(&s); err != nil {
				return s, err
			}
		}
		return s, q.Finish()
	}
	if s, err := read("token_base=4611686018427387904"); err != nil || s.TokenBase != locker.MaxTokenBase {
		t.Errorf("token_base=2^62: %v, TokenBase %d", err, s.TokenBase)
	}
	if s, err := read("token_base=0"); err != nil || s.TokenBase != 0 {
		t.Errorf("token_base=0: %v, TokenBase %d", err, s.TokenBase)
	}
	for _, bad := range []string{"token_base=-1", "token_base=4611686018427387905", "token_base=1e9", "token_base=", "token_base=1&token_base=2"} {
		if _, err := read(bad); !errors.Is(err, locker.ErrInvalidURL) || !strings.Contains(err.Error(), `"token_base"`) {
			t.Errorf("%s: %v; want an error wrapping ErrInvalidURL naming token_base", bad, err)
		}
	}
}
