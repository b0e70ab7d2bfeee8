package main

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// TestOneRunPerTick runs four instances of one job, each with its own Locker
// on one SQLite lock database (as four processes would), and checks that
// every tick ran exactly once.
func TestOneRunPerTick(t *testing.T) {
	url := "sqlite://" + filepath.Join(t.TempDir(), "locks.db")
	const instances, every, ticks = 4, 150 * time.Millisecond, 8
	// Until ticks ticks have run (a loaded machine skips some: an instance
	// too late for a tick leaves it), within a generous bound.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	runs := map[time.Time][]int{}
	var wg sync.WaitGroup
	for i := range instances {
		l, err := locker.Open(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = schedule(ctx, l, "job", every, func(_ context.Context, tick time.Time, _ locker.Handle) error {
				mu.Lock()
				runs[tick] = append(runs[tick], i)
				if len(runs) >= ticks {
					cancel()
				}
				mu.Unlock()
				return nil
			})
		}()
	}
	wg.Wait()
	if len(runs) < ticks {
		t.Errorf("%d ticks ran in 30s, want %d", len(runs), ticks)
	}
	for tick, who := range runs {
		if len(who) != 1 {
			t.Errorf("tick %s ran %d times (instances %v), want once", tick.Format(time.StampMilli), len(who), who)
		}
	}
}

// slowLocker is a Locker whose TryAcquire starts late, as an instance's
// would after a GC pause or on a loaded host.
type slowLocker struct {
	locker.Locker
	delay time.Duration
}

func (s slowLocker) TryAcquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(s.delay):
	}
	return s.Locker.TryAcquire(ctx, key, opts...)
}

// TestLateInstanceSkipsTick: an instance whose TryAcquire for a tick comes
// after the next tick has started (here 1.5 periods late) must not run that
// tick again once the instance that ran it has moved on.
func TestLateInstanceSkipsTick(t *testing.T) {
	url := "sqlite://" + filepath.Join(t.TempDir(), "locks.db")
	const every, ticks = 200 * time.Millisecond, 6
	ctx, cancel := context.WithTimeout(context.Background(), ticks*every+every/2)
	defer cancel()
	var mu sync.Mutex
	runs := map[time.Time][]string{}
	var wg sync.WaitGroup
	for _, name := range []string{"prompt", "late"} {
		l, err := locker.Open(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		var ll locker.Locker = l
		if name == "late" {
			ll = slowLocker{l, every + every/2}
		}
		wg.Go(func() {
			_ = schedule(ctx, ll, "job", every, func(_ context.Context, tick time.Time, _ locker.Handle) error {
				mu.Lock()
				runs[tick] = append(runs[tick], name)
				mu.Unlock()
				return nil
			})
		})
	}
	wg.Wait()
	if len(runs) < ticks-2 {
		t.Errorf("%d ticks ran, want about %d", len(runs), ticks)
	}
	for tick, who := range runs {
		if len(who) != 1 {
			t.Errorf("tick %s ran %d times (by %v), want once", tick.Format(time.StampMilli), len(who), who)
		}
	}
}
