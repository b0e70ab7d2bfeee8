package postgres

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// The keepalive settings drop a silent peer's connection within the lease,
// on the kernel's grid of whole seconds, and never below its 2s minimum;
// their values stay within Linux's limits for the socket options.
func TestKeepaliveFor(t *testing.T) {
	for _, c := range []struct {
		lease                 time.Duration
		idle, interval, total time.Duration
		count                 int
	}{
		{time.Second, time.Second, time.Second, 2 * time.Second, 1},
		{1500 * time.Millisecond, time.Second, time.Second, 2 * time.Second, 1},
		{2 * time.Second, time.Second, time.Second, 2 * time.Second, 1},
		{5 * time.Second, time.Second, time.Second, 5 * time.Second, 4},
		{7500 * time.Millisecond, time.Second, time.Second, 7 * time.Second, 6},
		{30 * time.Second, 7 * time.Second, 7 * time.Second, 28 * time.Second, 3},
		{24 * time.Hour, 6 * time.Hour, 6 * time.Hour, 24 * time.Hour, 3},
	} {
		ka := keepaliveFor(c.lease)
		if ka.idle != c.idle || ka.interval != c.interval || ka.count != c.count || ka.total != c.total {
			t.Errorf("keepaliveFor(%v) = %+v, want idle %v interval %v count %d total %v", c.lease, ka, c.idle, c.interval, c.count, c.total)
		}
	}
	for d := locker.MinTTL; d <= locker.MaxTTL; d += d/3 + 7*time.Millisecond {
		ka := keepaliveFor(d)
		if ka.total != ka.idle+time.Duration(ka.count)*ka.interval {
			t.Errorf("keepaliveFor(%v) = %+v: total is not idle + count×interval", d, ka)
		}
		if ka.total > max(d, minKeepalive) {
			t.Errorf("keepaliveFor(%v) = %+v: drops a silent peer after more than the lease", d, ka)
		}
		if ka.idle < time.Second || ka.idle > maxKeepaliveSecs*time.Second || ka.count < 1 || ka.count > maxKeepaliveCount {
			t.Errorf("keepaliveFor(%v) = %+v: outside the socket options' limits", d, ka)
		}
	}
}

// The lease is the TTL asked, to the millisecond, where the server has
// idle_session_timeout (14+, and a server that reports no version); on an
// older one, what TCP keepalive gives. The session settings follow the
// server's version, the health checks come at least every third of the
// lease, and the drift margin is the shared one.
func TestTermsFor(t *testing.T) {
	l := &Locker{cfg: newConfig(nil)}
	for _, c := range []struct {
		ttl    time.Duration
		major  int
		lease  time.Duration
		names  []string
		values []string
	}{
		{2 * time.Second, 16, 2 * time.Second, []string{gucIdle}, []string{"2000ms"}},
		{1500*time.Millisecond + 700*time.Microsecond, 0, 1500 * time.Millisecond, []string{gucIdle}, []string{"1500ms"}},
		{24 * time.Hour, 14, 24 * time.Hour, []string{gucIdle}, []string{"86400000ms"}},
		{30 * time.Second, 13, 28 * time.Second,
			[]string{gucKAIdle, gucKAIntvl, gucKACount, gucUser},
			[]string{"7s", "7s", "3", "28000ms"}},
		{time.Second, 11, 2 * time.Second,
			[]string{gucKAIdle, gucKAIntvl, gucKACount},
			[]string{"1s", "1s", "1"}},
	} {
		got, err := l.termsFor(c.ttl, c.major)
		if err != nil {
			t.Errorf("termsFor(%v, %d): %v", c.ttl, c.major, err)
			continue
		}
		if got.lease != c.lease || !slices.Equal(got.names, c.names) || !slices.Equal(got.values, c.values) {
			t.Errorf("termsFor(%v, %d) = lease %v, %v = %v; want lease %v, %v = %v", c.ttl, c.major, got.lease, got.names, got.values, c.lease, c.names, c.values)
		}
		if want := min(DefaultHealthCheckInterval, got.lease/3); got.period != want {
			t.Errorf("termsFor(%v, %d): period %v, want %v", c.ttl, c.major, got.period, want)
		}
		if want := min(got.lease/50+100*time.Millisecond, got.lease/4); got.drift != want {
			t.Errorf("termsFor(%v, %d): drift %v, want %v", c.ttl, c.major, got.drift, want)
		}
	}
}

// WithDefaultTTL (URL: ttl) sets the TTL of a lock taken without
// locker.WithTTL, and WithDriftMargin (drift_margin) the margin; a margin
// of half the TTL or more is refused, for the default TTL at once, for a
// per-call TTL by that call.
func TestDefaultTTLAndDrift(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := newConfig([]Option{WithDefaultTTL(5 * time.Second), WithDriftMargin(time.Second)})
	if cfg.err != nil {
		t.Fatalf("WithDefaultTTL(5s), WithDriftMargin(1s): %v", cfg.err)
	}
	l := &Locker{cfg: cfg}
	if got := l.ttlOf(locker.Options{}); got != 5*time.Second {
		t.Errorf("TTL without WithTTL: %v, want the Locker's default 5s", got)
	}
	if got := l.ttlOf(locker.Options{TTL: 3 * time.Second}); got != 3*time.Second {
		t.Errorf("TTL with WithTTL(3s): %v, want 3s", got)
	}
	if tm, _ := l.termsFor(5*time.Second, 16); tm.drift != time.Second {
		t.Errorf("drift margin of a 5s lease with WithDriftMargin(1s): %v", tm.drift)
	}
	if got := (&Locker{cfg: newConfig(nil)}).ttlOf(locker.Options{}); got != locker.DefaultTTL {
		t.Errorf("TTL without any: %v, want locker.DefaultTTL", got)
	}

	pool := unreachablePool(t)
	for _, opts := range [][]Option{
		{WithDefaultTTL(0)},
		{WithDefaultTTL(25 * time.Hour)},
		{WithDefaultTTL(2 * time.Second), WithDriftMargin(time.Second)},
		{WithDriftMargin(-time.Second)},
	} {
		if err := New(pool, opts...).Err(); !errors.Is(err, locker.ErrInvalidOption) {
			t.Errorf("%d options: Err() = %v, want ErrInvalidOption", len(opts), err)
		}
	}
	l2 := New(pool, WithDriftMargin(time.Second))
	defer l2.Close()
	if _, err := l2.TryAcquire(ctx, "k", locker.WithTTL(2*time.Second)); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("drift margin 1s, WithTTL(2s): %v, want ErrInvalidOption", err)
	}

	for _, c := range []struct {
		query string
		ttl   time.Duration
		drift time.Duration
	}{
		{"ttl=7s", 7 * time.Second, 0},
		{"ttl=7s&drift_margin=300ms", 7 * time.Second, 300 * time.Millisecond},
	} {
		u, _ := url.Parse("postgres://u@127.0.0.1:1/db?" + c.query)
		lk, err := locker.Open(ctx, u.String())
		if err != nil {
			t.Errorf("Open(?%s): %v", c.query, err)
			continue
		}
		pl := lk.(*Locker)
		if pl.cfg.TTL != c.ttl || pl.cfg.DriftMargin != c.drift {
			t.Errorf("Open(?%s): default TTL %v, drift margin %v; want %v, %v", c.query, pl.cfg.TTL, pl.cfg.DriftMargin, c.ttl, c.drift)
		}
		lk.Close()
	}
	if _, err := locker.Open(ctx, "postgres://u@127.0.0.1:1/db?ttl=2s&drift_margin=1s"); !errors.Is(err, locker.ErrInvalidURL) {
		t.Errorf("Open(?ttl=2s&drift_margin=1s): %v, want ErrInvalidURL", err)
	}
}
