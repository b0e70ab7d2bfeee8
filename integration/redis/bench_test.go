package redis_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/internal/benchstats"
	"github.com/go-locker/locker/redis"
)

// The benchmarks run against the shared test server, each next to a raw
// go-redis baseline doing the same job by hand: SET NX PX to take the lock,
// the compare-and-delete script (EVALSHA) to give it back, and a retry loop
// that sleeps rawPoll between attempts to wait. rawPoll is short on purpose
// (real code often sleeps 50-100ms): the baseline's latency is then close to
// its best, and its cost shows in the commands it sends.
//
//	cd integration && go test -run '^$' -bench . -benchmem -count 5 ./redis

const rawPoll = time.Millisecond

var rawRelease = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

func benchClient(b *testing.B, addr string) *goredis.Client {
	return goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 128})
}

// rawLock takes key with SET NX PX, retrying every rawPoll.
func rawLock(ctx context.Context, c *goredis.Client, key, owner string) error {
	for {
		ok, err := c.SetNX(ctx, key, owner, 30*time.Second).Result()
		if err != nil || ok {
			return err
		}
		select {
		case <-time.After(rawPoll):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func rawUnlock(ctx context.Context, c *goredis.Client, key, owner string) error {
	return rawRelease.Run(ctx, c, []string{key}, owner).Err()
}

// requestCounter counts the requests a client sends (one per command, a
// pipeline counting its commands), Pub/Sub commands aside: the round trips
// and server calls an acquisition costs, failed attempts included.
type requestCounter struct{ n atomic.Int64 }

func (r *requestCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (r *requestCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		r.n.Add(1)
		return next(ctx, cmd)
	}
}

func (r *requestCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		r.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// BenchmarkUncontended: one goroutine takes and gives back a free lock.
func BenchmarkUncontended(b *testing.B) {
	addr := testserver.Redis(b).Addr()
	ctx := context.Background()
	b.Run("impl=locker", func(b *testing.B) {
		c := benchClient(b, addr)
		defer c.Close()
		l := redis.New(c)
		defer l.Close()
		key := "bench/uncontended/" + randomID()
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			h, err := l.Acquire(ctx, key)
			if err != nil {
				b.Fatal(err)
			}
			if err := h.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("impl=raw", func(b *testing.B) {
		c := benchClient(b, addr)
		defer c.Close()
		key := "bench/uncontended-raw/" + randomID()
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			owner := randomID()
			if err := rawLock(ctx, c, key, owner); err != nil {
				b.Fatal(err)
			}
			if err := rawUnlock(ctx, c, key, owner); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkUncontendedInterleaved alternates the two within one loop, so
// that both see the same machine load (the sub-benchmarks above run one
// after the other, and a busy machine skews them differently). ns/op is one
// locker cycle plus one raw cycle; the medians of each are reported.
func BenchmarkUncontendedInterleaved(b *testing.B) {
	addr := testserver.Redis(b).Addr()
	ctx := context.Background()
	c := benchClient(b, addr)
	defer c.Close()
	l := redis.New(c)
	defer l.Close()
	key, rawKey := "bench/interleaved/"+randomID(), "bench/interleaved-raw/"+randomID()
	lockerT := make([]time.Duration, 0, b.N)
	rawT := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		h, err := l.Acquire(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Release(ctx); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		owner := randomID()
		if err := rawLock(ctx, c, rawKey, owner); err != nil {
			b.Fatal(err)
		}
		if err := rawUnlock(ctx, c, rawKey, owner); err != nil {
			b.Fatal(err)
		}
		lockerT = append(lockerT, mid.Sub(start))
		rawT = append(rawT, time.Since(mid))
	}
	b.StopTimer()
	slices.Sort(lockerT)
	slices.Sort(rawT)
	b.ReportMetric(float64(lockerT[len(lockerT)/2].Nanoseconds())/1e3, "locker-p50-µs")
	b.ReportMetric(float64(rawT[len(rawT)/2].Nanoseconds())/1e3, "raw-p50-µs")
}

// BenchmarkHandoff measures the time from the start of a release to the
// moment the next waiter holds the lock, with 1, 8 and 64 waiters: with
// impl=locker each on its own Locker (like separate processes: every
// release wakes one waiter per Locker, all of which try), with
// impl=locker-shared all on one Locker (a release wakes one of them). A
// goroutine that released does not compete again until another has taken
// the lock, so every sample is a real handoff. Reported: p50 and p99 in
// microseconds, and the requests sent per handoff (all goroutines, failed
// attempts and polls included); ns/op is the mean cycle (hold + release +
// handoff).
func BenchmarkHandoff(b *testing.B) {
	addr := testserver.Redis(b).Addr()
	for _, waiters := range []int{1, 8, 64} {
		for _, impl := range []string{"locker", "locker-shared", "raw"} {
			b.Run(fmt.Sprintf("waiters=%d/impl=%s", waiters, impl), func(b *testing.B) {
				benchHandoff(b, addr, waiters, impl)
			})
		}
	}
}

// handoffHold is how long each holder keeps the lock in BenchmarkHandoff.
const handoffHold = 2 * time.Millisecond

func benchHandoff(b *testing.B, addr string, waiters int, impl string) {
	raw := impl == "raw"
	c := benchClient(b, addr)
	defer c.Close()
	key := "bench/handoff/" + randomID()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var (
		mu       sync.Mutex
		samples  = make([]time.Duration, 0, b.N)
		released atomic.Int64 // nanoseconds since base when the last release began
		gen      atomic.Int64 // acquisitions so far
		base     = time.Now()
		wg       sync.WaitGroup
	)
	reqs := &requestCounter{}
	c.AddHook(reqs)
	lockers := make([]*redis.Locker, waiters+1)
	for i := range lockers {
		if impl == "locker-shared" && i > 0 {
			lockers[i] = lockers[0]
			continue
		}
		lockers[i] = redis.New(c)
	}
	defer func() {
		for _, l := range lockers {
			_ = l.Close()
		}
	}()
	b.ResetTimer()
	for i := range waiters + 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				var release func() error
				if raw {
					owner := randomID()
					if rawLock(ctx, c, key, owner) != nil {
						return
					}
					release = func() error { return rawUnlock(context.Background(), c, key, owner) }
				} else {
					h, err := lockers[i].Acquire(ctx, key)
					if err != nil {
						return
					}
					release = func() error { return h.Release(context.Background()) }
				}
				now := time.Since(base)
				my := gen.Add(1)
				if rel := released.Load(); rel != 0 {
					mu.Lock()
					samples = append(samples, now-time.Duration(rel))
					n := len(samples)
					mu.Unlock()
					if n >= b.N {
						cancel()
					}
				}
				// Hold long enough for every other goroutine, the previous
				// holder included, to be waiting when the release comes;
				// otherwise the measurement would see barging, not handoff.
				time.Sleep(handoffHold)
				released.Store(int64(time.Since(base)))
				if err := release(); err != nil {
					b.Error(err)
					return
				}
				// Stand back until someone else has taken the lock.
				for gen.Load() == my && ctx.Err() == nil {
					time.Sleep(50 * time.Microsecond)
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	benchstats.ReportPercentiles(b, samples)
	b.ReportMetric(float64(reqs.n.Load())/float64(len(samples)+1), "reqs/handoff")
}

// BenchmarkContended: 16 goroutines on 4 Lockers take and give back one key
// as fast as they can. ns/op is per acquisition; reqs/acq counts the
// requests each acquisition cost (attempts, failed ones included, and the
// release; Pub/Sub commands not counted).
func BenchmarkContended(b *testing.B) {
	addr := testserver.Redis(b).Addr()
	for _, impl := range []string{"locker", "raw"} {
		b.Run("impl="+impl, func(b *testing.B) {
			const lockersN, perLocker = 4, 4
			c := benchClient(b, addr)
			defer c.Close()
			key := "bench/contended/" + randomID()
			lockers := make([]*redis.Locker, lockersN)
			for i := range lockers {
				lockers[i] = redis.New(c)
			}
			defer func() {
				for _, l := range lockers {
					_ = l.Close()
				}
			}()
			ctx := context.Background()
			var left atomic.Int64
			left.Store(int64(b.N))
			reqs := &requestCounter{}
			c.AddHook(reqs)
			b.ResetTimer()
			var wg sync.WaitGroup
			for i := range lockersN * perLocker {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for left.Add(-1) >= 0 {
						if impl == "raw" {
							owner := randomID()
							if err := rawLock(ctx, c, key, owner); err != nil {
								b.Error(err)
								return
							}
							if err := rawUnlock(ctx, c, key, owner); err != nil {
								b.Error(err)
								return
							}
							continue
						}
						h, err := lockers[i%lockersN].Acquire(ctx, key)
						if err != nil {
							b.Error(err)
							return
						}
						if err := h.Release(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(reqs.n.Load())/float64(b.N), "reqs/acq")
		})
	}
}
