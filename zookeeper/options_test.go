package zookeeper

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

func TestOptionsRejectBadValues(t *testing.T) {
	for name, opt := range map[string]Option{
		"WithPrefix":         WithPrefix("relative"),
		"WithSessionTimeout": WithSessionTimeout(10 * time.Millisecond),
		"WithACL":            WithACL(),
		"WithAuth":           WithAuth("", nil),
		"WithDriftMargin":    WithDriftMargin(time.Millisecond),
	} {
		if c := newConfig([]Option{opt}); !errors.Is(c.err, locker.ErrInvalidOption) {
			t.Errorf("%s: config error %v, want an error wrapping locker.ErrInvalidOption", name, c.err)
		}
	}
}

func TestDriftMargin(t *testing.T) {
	c := newConfig(nil)
	if got := c.driftMargin(10 * time.Second); got != time.Second {
		t.Errorf("default margin for 10s = %v, want 1s", got)
	}
	if got := c.driftMargin(time.Second); got != 100*time.Millisecond {
		t.Errorf("default margin for 1s = %v, want 100ms", got)
	}
	c = newConfig([]Option{WithDriftMargin(300 * time.Millisecond)})
	if got := c.driftMargin(10 * time.Second); got != 300*time.Millisecond {
		t.Errorf("margin = %v, want 300ms", got)
	}
}

// New without WithSessionTimeout cannot know the lease: every call says so,
// without touching the (here absent) connection, and Close returns.
func TestNewNeedsSessionTimeout(t *testing.T) {
	l := New(nil, nil)
	_, err := l.TryAcquire(context.Background(), "k")
	if !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("TryAcquire: %v, want an error wrapping locker.ErrInvalidOption", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

func TestConnectRejectsBadInput(t *testing.T) {
	ctx := context.Background()
	if _, err := Connect(ctx, nil); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("Connect(no servers): %v", err)
	}
	if _, err := Connect(ctx, []string{"h:2181"}, WithPrefix("x")); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("Connect(bad root): %v", err)
	}
	// New's options: Connect sizes its sessions from the TTLs and takes
	// the servers as its argument.
	if _, err := Connect(ctx, []string{"h:2181"}, WithSessionTimeout(4*time.Second)); !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), "WithDefaultTTL") {
		t.Errorf("Connect(WithSessionTimeout): %v, want ErrInvalidOption pointing to WithDefaultTTL", err)
	}
	if _, err := Connect(ctx, []string{"h:2181"}, WithServers("h:2181")); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("Connect(WithServers): %v, want ErrInvalidOption", err)
	}
}

// TestLeaseStep: a TTL is rounded down to a lease step, at most a third
// below it; round values are steps of their own.
func TestLeaseStep(t *testing.T) {
	for ttl, want := range map[time.Duration]time.Duration{
		time.Second:                     time.Second,
		1500 * time.Millisecond:         1500 * time.Millisecond,
		1999 * time.Millisecond:         1500 * time.Millisecond,
		5 * time.Second:                 5 * time.Second,
		7 * time.Second:                 6 * time.Second,
		locker.DefaultTTL:               locker.DefaultTTL,
		45 * time.Second:                40 * time.Second,
		time.Minute:                     time.Minute,
		90 * time.Second:                90 * time.Second,
		59 * time.Minute:                50 * time.Minute,
		time.Hour:                       time.Hour,
		12 * time.Hour:                  12 * time.Hour,
		23 * time.Hour:                  20 * time.Hour,
		locker.MaxTTL:                   locker.MaxTTL,
		locker.MaxTTL - time.Second:     20 * time.Hour,
		locker.MinTTL + time.Nanosecond: locker.MinTTL,
	} {
		if got := leaseStep(ttl); got != want {
			t.Errorf("leaseStep(%v) = %v, want %v", ttl, got, want)
		}
	}
	if n := len(leaseSteps); n != 43 {
		t.Errorf("%d lease steps, want the 43 the package documentation names", n)
	}
	for i := 1; i < len(leaseSteps); i++ {
		if prev, s := leaseSteps[i-1], leaseSteps[i]; prev >= s || s-prev > s/3+time.Nanosecond {
			t.Errorf("steps %v and %v: rounding down between them loses more than a third", prev, s)
		}
	}
}

func TestHostListRetryStart(t *testing.T) {
	var h hostList
	if err := h.Init([]string{"a:1"}); err != nil {
		t.Fatal(err)
	}
	if _, retry := h.Next(); retry {
		t.Error("first try reported a retry start")
	}
	if _, retry := h.Next(); !retry {
		t.Error("second try without success did not report a retry start")
	}
	h.Connected()
	if _, retry := h.Next(); retry {
		t.Error("first try after a connection reported a retry start: go-zookeeper would sleep a second before reconnecting")
	}
}
