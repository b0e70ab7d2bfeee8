package sqltable_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
)

// TestFairness: 8 clients (a Locker each, on a pool of its own, like 8
// processes) take one key over and over, holding it 1ms, each asking again
// as soon as it has released. A queue that serves its waiters in turn
// gives each client about the same count; a lock whose releasing client
// takes the key straight back, or whose fresh callers overtake the woken
// waiters, gives a few clients most turns. Over 800 turns (100 a client)
// FIFO keeps the fewest over the most near 1 (a client is at most a turn
// or two behind at the end); 0.8 leaves room for a waiter that was late
// to queue now and then, not for chance.
func TestFairness(t *testing.T) {
	forEach(t, func(t *testing.T, d dialect) {
		const clients, turns = 8, 800
		ctx := testCtx(t)
		key := testKey(t, "")
		lockers := make([]locker.Locker, clients)
		for i := range lockers {
			lockers[i] = open(t, d.url(t, "", url.Values{"lock_max_conns": {"4"}}))
		}
		// Warm up: each Locker's connections and listener.
		for _, l := range lockers {
			mustRelease(t, ctx, mustAcquire(t, ctx, l, key))
		}
		var (
			total  atomic.Int64
			counts = make([]int64, clients)
			holder atomic.Int32
			wg     sync.WaitGroup
			errs   = make(chan error, clients)
		)
		start := time.Now()
		for i, l := range lockers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for total.Load() < turns {
					h, err := l.Acquire(ctx, key)
					if err != nil {
						errs <- fmt.Errorf("client %d: Acquire: %w", i, err)
						return
					}
					if !holder.CompareAndSwap(0, int32(i+1)) {
						errs <- fmt.Errorf("client %d: two holders at once", i)
					}
					if total.Add(1) <= turns {
						counts[i]++
					}
					time.Sleep(time.Millisecond)
					holder.Store(0)
					if err := h.Release(ctx); err != nil {
						errs <- fmt.Errorf("client %d: Release: %w", i, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		share := float64(slices.Min(counts)) / float64(slices.Max(counts))
		t.Logf("%d turns in %v (%.0f/s); per client %v; min/max share %.2f", turns, time.Since(start).Round(time.Millisecond), turns/time.Since(start).Seconds(), counts, share)
		if share < 0.8 {
			t.Errorf("min/max share %.2f < 0.8: turns per client %v", share, counts)
		}
	})
}

// BenchmarkScale is the shared Scale case (conformance/benchmark.RunScale)
// on one key, 8 and 64 clients (each a Locker on a pool of its own of 4
// connections, like a process), each dialect: acquisitions per second,
// the wait and handoff percentiles and the share (fewest acquisitions of a
// client over the most).
//
//	cd integration && go test -run '^$' -bench '^BenchmarkScale$' -benchtime 2000x ./sqltable
func BenchmarkScale(b *testing.B) {
	for _, d := range dialects {
		for _, clients := range []int{8, 64} {
			b.Run(fmt.Sprintf("%s/keys=1,clients=%d", d.name, clients), func(b *testing.B) {
				benchmark.RunScale(b, benchmark.Scale{
					Keys: 1, Clients: clients, Hold: time.Millisecond,
					Sides: []benchmark.ScaleSide{{Name: "locker", Client: benchmark.LockerClient(func(tb testing.TB) locker.Locker {
						return open(tb, d.url(tb, "", url.Values{"lock_max_conns": {"4"}}))
					})}},
				})
			})
		}
	}
}

var _ = context.Background
