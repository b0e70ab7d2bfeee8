package etcd

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker"
)

func TestOptions(t *testing.T) {
	for _, c := range []struct {
		name string
		opt  Option
	}{
		{"empty prefix", WithPrefix("")},
		{"prefix with trailing slash", WithPrefix("/a/")},
		{"ttl below a second", WithDefaultTTL(500 * time.Millisecond)},
		{"tiny drift margin", WithDriftMargin(time.Millisecond)},
	} {
		if cfg := newConfig([]Option{c.opt}); !errors.Is(cfg.err, locker.ErrInvalidOption) {
			t.Errorf("%s: %v, want an error wrapping locker.ErrInvalidOption", c.name, cfg.err)
		}
	}
	cfg := newConfig([]Option{WithPrefix("/x"), WithDefaultTTL(3 * time.Second), WithDriftMargin(time.Second)})
	if cfg.err != nil || cfg.Prefix != "/x" || cfg.TTL != 3*time.Second || cfg.driftMargin(2*time.Second) != time.Second {
		t.Errorf("config = %+v", cfg)
	}
	def := newConfig(nil)
	if d := def.driftMargin(10 * time.Second); d != time.Second {
		t.Errorf("default drift margin of a 10s TTL = %v, want 1s", d)
	}
	if d := def.driftMargin(time.Second); d != 100*time.Millisecond {
		t.Errorf("default drift margin of a 1s TTL = %v, want 100ms", d)
	}
}

func TestLeaseSeconds(t *testing.T) {
	for ttl, want := range map[time.Duration]int64{time.Second: 1, 1500 * time.Millisecond: 1, 2 * time.Second: 2, 10*time.Second + 1: 10, 24 * time.Hour: 86400} {
		if got := leaseSeconds(ttl); got != want {
			t.Errorf("leaseSeconds(%v) = %d, want %d", ttl, got, want)
		}
	}
}

// Bad input fails before anything reaches the (here absent) server.
func TestBadInputNoServer(t *testing.T) {
	ctx := context.Background()
	l := New(nil)
	defer l.Close()
	if _, err := l.Acquire(ctx, "k"); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("Acquire on a nil client: %v, want ErrInvalidOption", err)
	}
	// A client that was never connected: the checks below come first.
	l2 := New(new(clientv3.Client), WithPrefix("/x"))
	defer l2.Close()
	if _, err := l2.TryAcquire(ctx, ""); !errors.Is(err, locker.ErrInvalidKey) {
		t.Errorf("TryAcquire of an empty key: %v, want ErrInvalidKey", err)
	}
	if _, err := l2.TryAcquire(ctx, "k", locker.WithTTL(100*time.Millisecond)); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("TryAcquire with a 100ms TTL: %v, want ErrInvalidOption", err)
	}
	_ = l2.Close()
	if _, err := l2.TryAcquire(ctx, "k"); !errors.Is(err, locker.ErrClosed) {
		t.Errorf("TryAcquire after Close: %v, want ErrClosed", err)
	}
}
