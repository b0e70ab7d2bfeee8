package lease

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

var limits = Limits{Backend: "test"}

func TestCheck(t *testing.T) {
	for _, c := range []struct {
		ttl  time.Duration
		want string
	}{
		{locker.MinTTL, ""},
		{locker.MaxTTL, ""},
		{locker.MinTTL - 1, "test: TTL 999.999999ms is outside the portable range [1s, 24h0m0s]"},
		{locker.MaxTTL + 1, "test: TTL 24h0m0.000000001s is outside the portable range [1s, 24h0m0s]"},
	} {
		err := limits.Check(c.ttl)
		if c.want == "" {
			if err != nil {
				t.Errorf("Check(%v) = %v", c.ttl, err)
			}
			continue
		}
		if !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Check(%v) = %v, want ErrInvalidOption saying %q", c.ttl, err, c.want)
		}
	}
}

func TestTTL(t *testing.T) {
	if got, err := limits.TTL(time.Minute, nil); err != nil || got != time.Minute {
		t.Errorf("TTL(default) = %v, %v", got, err)
	}
	if got, err := limits.TTL(time.Minute, []locker.Option{locker.WithTTL(time.Second)}); err != nil || got != time.Second {
		t.Errorf("TTL(WithTTL(1s)) = %v, %v", got, err)
	}
	if _, err := limits.TTL(time.Minute, []locker.Option{locker.WithTTL(time.Millisecond)}); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("TTL(WithTTL(1ms)) = %v, want ErrInvalidOption", err)
	}
}

func TestDrift(t *testing.T) {
	for _, c := range []struct{ ttl, want time.Duration }{
		{30 * time.Second, 700 * time.Millisecond},
		{time.Second, 120 * time.Millisecond},
		{200 * time.Millisecond, 50 * time.Millisecond}, // capped at TTL/4
	} {
		if got, err := limits.Drift("drift", 0, c.ttl); err != nil || got != c.want {
			t.Errorf("Drift(0, %v) = %v, %v; want %v", c.ttl, got, err, c.want)
		}
	}
	if got, err := limits.Drift("drift", 300*time.Millisecond, time.Second); err != nil || got != 300*time.Millisecond {
		t.Errorf("configured drift: %v, %v", got, err)
	}
	if _, err := limits.Drift("drift margin", 500*time.Millisecond, time.Second); !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), "drift margin 500ms is not below half the TTL 1s") {
		t.Errorf("drift of half the TTL: %v", err)
	}
}

func TestAtLeastPositive(t *testing.T) {
	if err := limits.AtLeast("retry interval", 0, time.Millisecond); !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), "test: retry interval must be at least 1ms, got 0s") {
		t.Errorf("AtLeast = %v", err)
	}
	if err := limits.AtLeast("retry interval", time.Millisecond, time.Millisecond); err != nil {
		t.Errorf("AtLeast at the floor = %v", err)
	}
	if err := limits.Positive("drift", -1); !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), "drift must be positive") {
		t.Errorf("Positive = %v", err)
	}
}

// Owner tokens are 22 base64url characters (the queue entries of redis and
// the notification payloads of sqltable split on ':', which they never
// hold) and do not repeat.
func TestNewOwner(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		o := NewOwner()
		if len(o) != 22 || strings.ContainsAny(o, ":+/=") {
			t.Fatalf("owner %q: want 22 base64url characters", o)
		}
		if seen[o] {
			t.Fatalf("owner %q drawn twice", o)
		}
		seen[o] = true
	}
}
