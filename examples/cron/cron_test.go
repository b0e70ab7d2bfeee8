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
	ctx, cancel := context.WithTimeout(context.Background(), ticks*every+every/2)
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
				mu.Unlock()
				return nil
			})
		}()
	}
	wg.Wait()
	if len(runs) < ticks-2 {
		t.Errorf("%d ticks ran, want about %d", len(runs), ticks)
	}
	for tick, who := range runs {
		if len(who) != 1 {
			t.Errorf("tick %s ran %d times (instances %v), want once", tick.Format(time.StampMilli), len(who), who)
		}
	}
}
