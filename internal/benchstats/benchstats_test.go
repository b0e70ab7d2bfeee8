package benchstats

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	s := make([]time.Duration, 101)
	for i := range s {
		s[i] = time.Duration(i) * time.Microsecond
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{0, 0}, {0.5, 50 * time.Microsecond}, {0.99, 99 * time.Microsecond}, {1, 100 * time.Microsecond}} {
		if got := Percentile(s, c.p); got != c.want {
			t.Errorf("Percentile(%v) = %v, want %v", c.p, got, c.want)
		}
	}
	if Percentile(nil, 0.5) != 0 {
		t.Error("Percentile of no samples is not 0")
	}
	if Micros(1500*time.Nanosecond) != 1.5 {
		t.Error("Micros(1.5µs) != 1.5")
	}
}

func TestRotated(t *testing.T) {
	var got []string
	for i := range 4 {
		Rotated(i, func() { got = append(got, "a") }, func() { got = append(got, "b") }, func() { got = append(got, "c") })
	}
	if s := strings.Join(got, ""); s != "abcbcacababc" {
		t.Errorf("order %q, want abcbcacababc", s)
	}
}

// TestContention: a phase makes exactly the acquisitions asked for, shared
// among the competitors, with one handoff for each after the first, never
// two holders at once; totals add up over phases until Reset; the first
// error ends the phase and is returned.
func TestContention(t *testing.T) {
	var (
		mu      sync.Mutex
		holders atomic.Int32
	)
	take := func(context.Context) (func(context.Context) error, error) {
		mu.Lock()
		if holders.Add(1) != 1 {
			t.Error("two holders at once")
		}
		return func(context.Context) error { holders.Add(-1); mu.Unlock(); return nil }, nil
	}
	c := &Contention{Takes: []Take{take, take, take, take}, Hold: 10 * time.Microsecond}
	for range 2 {
		if err := c.Run(context.Background(), 40); err != nil {
			t.Fatal(err)
		}
	}
	var sum int64
	for _, n := range c.Counts {
		sum += n
	}
	if sum != 80 || c.Acquired != 80 {
		t.Fatalf("%d acquisitions counted (Acquired %d), want 80", sum, c.Acquired)
	}
	if len(c.Handoffs) != 78 {
		t.Fatalf("%d handoffs, want 78 (one per acquisition but the first of each phase)", len(c.Handoffs))
	}
	if c.Throughput() <= 0 || c.Share() < 0 || c.Share() > 1 {
		t.Fatalf("throughput %v, share %v", c.Throughput(), c.Share())
	}
	c.Reset()
	if c.Acquired != 0 || c.Elapsed != 0 || len(c.Handoffs) != 0 || slices.Max(c.Counts) != 0 {
		t.Fatal("Reset left totals behind")
	}
	boom := errors.New("boom")
	c.Takes = append(c.Takes, func(context.Context) (func(context.Context) error, error) { return nil, boom })
	if err := c.Run(context.Background(), 40); !errors.Is(err, boom) {
		t.Fatalf("Run with a failing Take: %v, want %v", err, boom)
	}
}
