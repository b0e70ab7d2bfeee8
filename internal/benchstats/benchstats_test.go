package benchstats

import (
	"strings"
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
