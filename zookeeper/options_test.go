package zookeeper

import (
	"context"
	"errors"
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
