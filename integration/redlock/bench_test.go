package redlock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	rsredis "github.com/go-redsync/redsync/v4/redis"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/internal/benchstats"
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
func benchClients(b *testing.B, addrs []string) []*goredis.Client {
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

// BenchmarkUncontendedInterleaved alternates, in one loop, an uncontended
// Acquire+Release of this package on 3 nodes, a Lock+Unlock of
// go-redsync/redsync v4 on the same 3 nodes (no tokens, no write-back
// round), and an Acquire+Release of the single-node redis backend on node
// 1, so that all see the same machine load. Reported: the p50 of each in
// microseconds and the ratios to redsync and to one node. ns/op is one
// cycle of all three.
func BenchmarkUncontendedInterleaved(b *testing.B) {
	addrs := nodeAddrs(b, 3)
	ctx := context.Background()
	cs := benchClients(b, addrs)
	rl := redlock.New(universal(cs))
	defer rl.Close()
	rs := newRedsync(cs)
	single := redis.New(cs[0])
	defer single.Close()
	key := "bench/uncontended/" + randomID()
	var tRL, tRS, tOne []time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		h, err := rl.Acquire(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Release(ctx); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		m := rs.NewMutex(key + "/redsync")
		if err := m.LockContext(ctx); err != nil {
			b.Fatal(err)
		}
		if _, err := m.UnlockContext(ctx); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		h, err = single.Acquire(ctx, key+"/single")
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Release(ctx); err != nil {
			b.Fatal(err)
		}
		tRL = append(tRL, t1.Sub(t0))
		tRS = append(tRS, t2.Sub(t1))
		tOne = append(tOne, time.Since(t2))
	}
	b.StopTimer()
	for _, s := range [][]time.Duration{tRL, tRS, tOne} {
		slices.Sort(s)
	}
	p50 := func(s []time.Duration) float64 { return benchstats.Micros(benchstats.Percentile(s, 0.5)) }
	b.ReportMetric(p50(tRL), "redlock-p50-µs")
	b.ReportMetric(p50(tRS), "redsync-p50-µs")
	b.ReportMetric(p50(tOne), "single-p50-µs")
	b.ReportMetric(p50(tRL)/p50(tRS), "redlock/redsync")
	b.ReportMetric(p50(tRL)/p50(tOne), "redlock/single")
}

// contender is one process taking the lock in a loop.
type contender interface {
	lock(ctx context.Context) (unlock func() error, err error)
}

type redlockContender struct {
	l   *redlock.Locker
	key string
}

func (c redlockContender) lock(ctx context.Context) (func() error, error) {
	h, err := c.l.Acquire(ctx, c.key)
	if err != nil {
		return nil, err
	}
	return func() error { return h.Release(ctx) }, nil
}

type redsyncContender struct {
	rs  *redsync.Redsync
	key string
}

func (c redsyncContender) lock(ctx context.Context) (func() error, error) {
	// Tries high enough never to give up under this contention; the
	// retry delay is redsync's default (random 50–250ms): it polls.
	m := c.rs.NewMutex(c.key, redsync.WithTries(1<<20))
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	return func() error { _, err := m.UnlockContext(ctx); return err }, nil
}

// group is G contenders, each with clients of its own (like processes),
// on one key, running until a given number of acquisitions is reached.
type group struct {
	cs       []contender
	counts   []int64
	acquired int64
	elapsed  time.Duration
	holders  atomic.Int32

	lastRelease atomic.Int64 // unix ns of the start of the last release in this phase; 0 none
	mu          sync.Mutex
	handoffs    []time.Duration // from the start of a release to the next acquisition returning
}

func (g *group) run(b *testing.B, ctx context.Context, n int64) {
	var total atomic.Int64
	var wg sync.WaitGroup
	g.lastRelease.Store(0)
	start := time.Now()
	for i, c := range g.cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for total.Load() < n {
				unlock, err := c.lock(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				if g.holders.Add(1) != 1 {
					b.Error("two holders at once")
				}
				if r := g.lastRelease.Load(); r != 0 {
					d := time.Since(time.Unix(0, r))
					g.mu.Lock()
					g.handoffs = append(g.handoffs, d)
					g.mu.Unlock()
				}
				total.Add(1)
				atomic.AddInt64(&g.counts[i], 1)
				g.holders.Add(-1)
				g.lastRelease.Store(time.Now().UnixNano())
				if err := unlock(); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	g.elapsed += time.Since(start)
	g.acquired += total.Load()
}

func (g *group) report(b *testing.B, name string) {
	lo, hi := slices.Min(g.counts), slices.Max(g.counts)
	b.ReportMetric(float64(g.acquired)/g.elapsed.Seconds(), name+"-acq/s")
	if hi > 0 {
		b.ReportMetric(float64(lo)/float64(hi), name+"-share")
	}
	if len(g.handoffs) > 0 {
		slices.Sort(g.handoffs)
		b.ReportMetric(benchstats.Micros(benchstats.Percentile(g.handoffs, 0.5)), name+"-handoff-p50-µs")
		b.ReportMetric(benchstats.Micros(benchstats.Percentile(g.handoffs, 0.99)), name+"-handoff-p99-µs")
	}
}

// BenchmarkContendedInterleaved runs 8 contenders, each on clients of its
// own, on one key with this package and with redsync (one key each), in
// phases of 32 acquisitions per implementation in turn, so that both see
// the same machine load. Each b.N is one phase of each. Reported:
// throughput (acquisitions per second) and fairness (share: the fewest
// acquisitions any contender made over the most; 1 is perfectly fair).
// Run with -benchtime 10x or more.
func BenchmarkContendedInterleaved(b *testing.B) {
	const contenders, phase = 8, 32
	addrs := nodeAddrs(b, 3)
	ctx := context.Background()
	key := "bench/contended/" + randomID()
	rl := &group{counts: make([]int64, contenders)}
	rs := &group{counts: make([]int64, contenders)}
	for range contenders {
		cs := benchClients(b, addrs)
		l := redlock.New(universal(cs))
		defer l.Close()
		rl.cs = append(rl.cs, redlockContender{l, key})
		rs.cs = append(rs.cs, redsyncContender{newRedsync(benchClients(b, addrs)), key + "/redsync"})
	}
	b.ResetTimer()
	for range b.N {
		rl.run(b, ctx, phase)
		rs.run(b, ctx, phase)
	}
	b.StopTimer()
	rl.report(b, "redlock")
	rs.report(b, "redsync")
	b.ReportMetric((float64(rl.acquired)/rl.elapsed.Seconds())/(float64(rs.acquired)/rs.elapsed.Seconds()), "throughput-redlock/redsync")
}
