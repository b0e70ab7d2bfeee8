package redlock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	rsredis "github.com/go-redsync/redsync/v4/redis"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis"
	"github.com/go-locker/locker/redis/redlock"
)

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// benchClients returns direct clients of addrs (no proxies), closed at the
// end of the benchmark.
func benchClients(b testing.TB, addrs []string) []*goredis.Client {
	out := make([]*goredis.Client, len(addrs))
	for i, a := range addrs {
		out[i] = newClient(b, a)
	}
	return out
}

func universal(cs []*goredis.Client) []goredis.UniversalClient {
	out := make([]goredis.UniversalClient, len(cs))
	for i, c := range cs {
		out[i] = c
	}
	return out
}

func newRedsync(cs []*goredis.Client) *redsync.Redsync {
	var pools []rsredis.Pool
	for _, c := range cs {
		pools = append(pools, rsgoredis.NewPool(c))
	}
	return redsync.New(pools...)
}

// BenchmarkLock runs the shared cases (conformance/benchmark) on this
// package's Locker on 3 nodes beside go-redsync/redsync v4 on the same 3
// nodes (SET NX PX on each, DEL by Lua; no tokens, no write-back round; it
// polls with its default random 50–250ms retry delay, with tries enough
// never to give up) and the single-node redis backend on node 1 (single):
// every contender on clients of its own, like processes.
//
//	cd integration && go test -run '^$' -bench '^BenchmarkLock$' -benchtime 400x ./redlock
func BenchmarkLock(b *testing.B) {
	addrs := nodeAddrs(b, 3)
	benchmark.Run(b, benchmark.Harness{Sides: lockSides(addrs)})
}

// BenchmarkInstructions counts the client's instructions per uncontended
// Acquire+Release under valgrind's callgrind (benchmark.RunInstructions:
// the test binary runs again as a child per side, on the nodes this run
// uses), for BenchmarkLock's sides: a figure of the client's own cost that
// neither the loopback nor the machine's load moves.
//
//	cd integration && go test -run '^$' -bench '^BenchmarkInstructions$' ./redlock
func BenchmarkInstructions(b *testing.B) {
	addrs := nodeAddrs(b, 3)
	benchmark.RunInstructions(b, benchmark.Instructions{
		Sides: lockSides(addrs), Runs: 2,
		Env: []string{testserver.EnvRedisNodes + "=" + strings.Join(nodesAddrs, ",")}, // every node nodeAddrs knows
	})
}

// lockSides are BenchmarkLock's sides on the nodes addrs.
func lockSides(addrs []string) []benchmark.Side {
	return []benchmark.Side{
		benchmark.LockerSide("redlock", 0, func(tb testing.TB) locker.Locker {
			return redlock.New(benchClients(tb, addrs))
		}),
		{Name: "redsync", New: func(tb testing.TB, key string, _ int) benchmark.Lock {
			rs := newRedsync(benchClients(tb, addrs))
			return func(ctx context.Context) (func(context.Context) error, error) {
				m := rs.NewMutex(key, redsync.WithTries(1<<20))
				if err := m.LockContext(ctx); err != nil {
					return nil, err
				}
				return func(ctx context.Context) error { _, err := m.UnlockContext(ctx); return err }, nil
			}
		}},
		benchmark.LockerSide("single", 0, func(tb testing.TB) locker.Locker { return redis.New(newClient(tb, addrs[0])) }),
	}
}

// BenchmarkSemaphore measures a semaphore of 4 permits under 16 contending
// clients (each a Locker of its own, like processes), each holding its
// permit 1ms, beside this package's mutex under the same 16 clients on the
// same 3 nodes, in alternating phases of b.N acquisitions per side (so
// both see the same machine load). It reports each side's acquisitions
// per second, round trips per acquisition, the most holders seen at once,
// and fairness: the fewest acquisitions of one client over the mean.
// (conformance/benchmark assumes one holder at a time, so it is not used.)
//
//	cd integration && go test -run '^$' -bench '^BenchmarkSemaphore$' -benchtime 512x ./redlock
func BenchmarkSemaphore(b *testing.B) {
	const clients, permits = 16, 4
	addrs := nodeAddrs(b, 3)
	type side struct {
		name  string
		rt    roundTrips
		locks []locker.Locker
		key   string
		acq   time.Duration
		n     int
		most  int32
		per   []int
	}
	sides := []*side{{name: "semaphore"}, {name: "mutex"}}
	for _, s := range sides {
		s.key = "bench/" + b.Name() + "/" + s.name + "/" + randomID()
		s.per = make([]int, clients)
		for range clients {
			cs := benchClients(b, addrs)
			for _, c := range cs {
				c.AddHook(&s.rt)
			}
			l := redlock.New(cs)
			b.Cleanup(func() { _ = l.Close() })
			if s.name == "semaphore" {
				s.locks = append(s.locks, locker.Semaphore(l, permits))
			} else {
				s.locks = append(s.locks, l)
			}
		}
	}
	ctx := context.Background()
	// phase runs count acquisitions of side s over its 16 clients.
	phase := func(s *side, count int) {
		var (
			wg     sync.WaitGroup
			left   atomic.Int64
			inside atomic.Int32
		)
		left.Store(int64(count))
		start := time.Now()
		for i, l := range s.locks {
			wg.Go(func() {
				for left.Add(-1) >= 0 {
					h, err := l.Acquire(ctx, s.key)
					if err != nil {
						b.Errorf("%s: %v", s.name, err)
						return
					}
					in := inside.Add(1)
					for m := atomic.LoadInt32(&s.most); in > m && !atomic.CompareAndSwapInt32(&s.most, m, in); m = atomic.LoadInt32(&s.most) {
					}
					time.Sleep(time.Millisecond)
					inside.Add(-1)
					s.per[i]++
					if err := h.Release(ctx); err != nil {
						b.Errorf("%s: release: %v", s.name, err)
						return
					}
				}
			})
		}
		wg.Wait()
		s.acq += time.Since(start)
		s.n += count
	}
	for _, s := range sides { // warm up: connections, subscriptions, scripts
		phase(s, 2*clients)
		s.acq, s.n, s.per = 0, 0, make([]int, clients)
		s.rt.trips.Store(0)
	}
	b.ResetTimer()
	for done, i := 0, 0; done < b.N; i++ {
		count := min(128, b.N-done)
		for j := range sides {
			phase(sides[(i+j)%len(sides)], count)
		}
		done += count
	}
	b.StopTimer()
	for _, s := range sides {
		b.ReportMetric(float64(s.n)/s.acq.Seconds(), s.name+"-acq/s")
		b.ReportMetric(float64(s.rt.trips.Load())/float64(s.n), s.name+"-trips/acq")
		b.ReportMetric(float64(s.most), s.name+"-most-holders")
		fewest := slices.Min(s.per)
		b.ReportMetric(float64(fewest)*float64(clients)/float64(s.n), s.name+"-fewest/mean")
	}
	if sides[0].most > permits || sides[1].most > 1 {
		b.Errorf("holders at once: semaphore %d (limit %d), mutex %d", sides[0].most, permits, sides[1].most)
	}
}
