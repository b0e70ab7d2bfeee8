package redis_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
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
// Beside them run the two libraries Go users most often pick for a lock on
// one Redis server, on the same client: bsm/redislock (SET NX PX in a
// script, compare-and-delete) and go-redsync/redsync v4 with one pool (SET
// NX PX, compare-and-delete). Neither hands out a fencing token, renews a
// lease, reports a lost lock or queues waiters: a waiter polls. They are
// given the same rawPoll retry as the raw lock (their defaults wait much
// longer: redislock does not retry unless told to, its README retries every
// 100ms; redsync sleeps a random 50-250ms), so their handoff latency is
// near its best and their cost shows in the commands they send.
//
//	cd integration && go test -run '^$' -bench . -benchmem -count 5 ./redis

const rawPoll = time.Millisecond

var rawRelease = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// rawFencedAcquire is the least a lock with a fencing token costs on Redis:
// SET NX PX and, when it took the lock, INCR of the key's counter, in one
// script so that no other holder can come between them. redislock and
// redsync hand out no token; a user who needs one must add this.
var rawFencedAcquire = goredis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return false
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

// BenchmarkUncontendedInterleaved runs the Locker, the raw lock above,
// raw-fenced, the least a lock with a fencing token costs (rawFencedAcquire,
// then the same compare-and-delete release), redislock and redsync in turn
// within one loop, so
// that all see the same machine load (the sub-benchmarks above run one after
// the other, and a busy machine skews them differently); which goes first
// rotates. It runs on a client with ContextTimeoutEnabled and on a plain one
// (the go-redis default), every side on the same client. ns/op is one cycle
// of each; the medians of each and the Locker's ratios to the others are
// reported.
func BenchmarkUncontendedInterleaved(b *testing.B) {
	addr := testserver.Redis(b).Addr()
	for _, tc := range []struct {
		name     string
		ctxAware bool
	}{{"client=context-timeout", true}, {"client=plain", false}} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: tc.ctxAware, PoolSize: 128})
			defer c.Close()
			l := redis.New(c)
			defer l.Close()
			key, rawKey := "bench/interleaved/"+randomID(), "bench/interleaved-raw/"+randomID()
			lockerT := make([]time.Duration, 0, b.N)
			rawT := make([]time.Duration, 0, b.N)
			lockerCycle := func() {
				start := time.Now()
				h, err := l.Acquire(ctx, key)
				if err != nil {
					b.Fatal(err)
				}
				if err := h.Release(ctx); err != nil {
					b.Fatal(err)
				}
				lockerT = append(lockerT, time.Since(start))
			}
			rawCycle := func() {
				start := time.Now()
				owner := randomID()
				if err := rawLock(ctx, c, rawKey, owner); err != nil {
					b.Fatal(err)
				}
				if err := rawUnlock(ctx, c, rawKey, owner); err != nil {
					b.Fatal(err)
				}
				rawT = append(rawT, time.Since(start))
			}
			fid := randomID() // one hash tag: the script's two keys share a Cluster slot
			fencedKey, fenceKey := "bench/{"+fid+"}/interleaved-fenced", "bench/{"+fid+"}/interleaved-fence"
			fencedT := make([]time.Duration, 0, b.N)
			fencedCycle := func() {
				start := time.Now()
				owner := randomID()
				token, err := rawFencedAcquire.Run(ctx, c, []string{fencedKey, fenceKey}, owner, 30000).Int64()
				if err != nil || token <= 0 {
					b.Fatalf("fenced acquire: not taken (token %d, %v); nobody else uses the key", token, err)
				}
				if err := rawUnlock(ctx, c, fencedKey, owner); err != nil {
					b.Fatal(err)
				}
				fencedT = append(fencedT, time.Since(start))
			}
			// The two libraries users would otherwise pick, on the same
			// client (see competitors; one competitor each, so no retry).
			libCycle := func(impl string) (func(), *[]time.Duration) {
				locks, closeAll := competitors(b, impl, c, "bench/interleaved-"+impl+"/"+randomID(), 1)
				b.Cleanup(closeAll)
				ts := make([]time.Duration, 0, b.N)
				return func() {
					start := time.Now()
					release, err := locks[0](ctx)
					if err != nil {
						b.Fatalf("%s: %v", impl, err)
					}
					if err := release(ctx); err != nil {
						b.Fatalf("%s: %v", impl, err)
					}
					ts = append(ts, time.Since(start))
				}, &ts
			}
			redislockCycle, redislockT := libCycle(implRedislock)
			redsyncCycle, redsyncT := libCycle(implRedsync)
			b.ResetTimer()
			for i := range b.N {
				benchstats.Rotated(i, lockerCycle, rawCycle, fencedCycle, redislockCycle, redsyncCycle)
			}
			b.StopTimer()
			p50 := func(ts []time.Duration) float64 {
				slices.Sort(ts)
				return benchstats.Micros(benchstats.Percentile(ts, 0.5))
			}
			lp, rp, fp, rlp, rsp := p50(lockerT), p50(rawT), p50(fencedT), p50(*redislockT), p50(*redsyncT)
			b.ReportMetric(lp, "locker-p50-µs")
			b.ReportMetric(rp, "raw-p50-µs")
			b.ReportMetric(fp, "raw-fenced-p50-µs")
			b.ReportMetric(rlp, "redislock-p50-µs")
			b.ReportMetric(rsp, "redsync-p50-µs")
			b.ReportMetric(lp/rp, "locker/raw")
			b.ReportMetric(lp/fp, "locker/raw-fenced")
			b.ReportMetric(lp/rlp, "locker/redislock")
			b.ReportMetric(lp/rsp, "locker/redsync")
		})
	}
}

// Implementations the handoff and contention benchmarks compare.
const (
	implLocker       = "locker"        // a Locker for each competitor, like separate processes
	implLockerShared = "locker-shared" // every competitor on one Locker
	implRaw          = "raw"           // SET NX PX polled every rawPoll, compare-and-delete
	implRedislock    = "redislock"     // bsm/redislock, retrying every rawPoll
	implRedsync      = "redsync"       // go-redsync/redsync v4 on one pool, retrying every rawPoll
)

// benchTTL is the lease of every lock the benchmarks take.
const benchTTL = 30 * time.Second

// lockFunc takes the benchmark's key, waiting as long as ctx allows, and
// returns what gives it back.
type lockFunc func(ctx context.Context) (release func(context.Context) error, err error)

// competitors returns n lockFuncs of impl on key, all through client c, each
// with a Locker, redislock client or redsync instance of its own (as
// separate processes would have; locker-shared: one Locker for all), and a
// func that closes the Lockers.
func competitors(b *testing.B, impl string, c *goredis.Client, key string, n int) ([]lockFunc, func()) {
	fs := make([]lockFunc, n)
	var lockers []*redis.Locker
	for i := range fs {
		switch impl {
		case implLocker, implLockerShared:
			if impl == implLocker || len(lockers) == 0 {
				lockers = append(lockers, redis.New(c))
			}
			l := lockers[len(lockers)-1]
			fs[i] = func(ctx context.Context) (func(context.Context) error, error) {
				h, err := l.Acquire(ctx, key)
				if err != nil {
					return nil, err
				}
				return h.Release, nil
			}
		case implRaw:
			fs[i] = func(ctx context.Context) (func(context.Context) error, error) {
				owner := randomID()
				if err := rawLock(ctx, c, key, owner); err != nil {
					return nil, err
				}
				return func(ctx context.Context) error { return rawUnlock(ctx, c, key, owner) }, nil
			}
		case implRedislock:
			rl := redislock.New(c)
			opts := &redislock.Options{RetryStrategy: redislock.LinearBackoff(rawPoll)}
			fs[i] = func(ctx context.Context) (func(context.Context) error, error) {
				lk, err := rl.Obtain(ctx, key, benchTTL, opts)
				if err != nil {
					return nil, err
				}
				return lk.Release, nil
			}
		case implRedsync:
			rs := redsync.New(rsgoredis.NewPool(c))
			fs[i] = func(ctx context.Context) (func(context.Context) error, error) {
				m := rs.NewMutex(key, redsync.WithExpiry(benchTTL), redsync.WithTries(math.MaxInt32),
					redsync.WithRetryDelay(rawPoll))
				if err := m.LockContext(ctx); err != nil {
					return nil, err
				}
				return func(ctx context.Context) error {
					if ok, err := m.UnlockContext(ctx); err != nil || !ok {
						return fmt.Errorf("redsync unlock: %v, %w", ok, err)
					}
					return nil
				}, nil
			}
		default:
			b.Fatalf("unknown implementation %q", impl)
		}
	}
	return fs, func() {
		for _, l := range lockers {
			_ = l.Close()
		}
	}
}

// sendsSet reports whether impl takes its lock with a SET of its own (not
// inside a script), which the server's count of client commands must then
// include (see commandStats.clientCommands).
func sendsSet(impl string) bool { return impl == implRaw || impl == implRedsync }

// BenchmarkHandoff measures the time from the start of a release to the
// moment the next waiter holds the lock, with 1, 8 and 64 waiters: with
// impl=locker each on its own Locker (like separate processes), with
// impl=locker-shared all on one Locker, and beside them raw, redislock and
// redsync (see competitors). A goroutine that released does not compete
// again until another has taken the lock, so every sample is a real
// handoff. Reported: p50 and p99 in microseconds; the requests sent per
// handoff as the client counts them (reqs/handoff: all goroutines, failed
// attempts and polls included, Pub/Sub commands not) and as the server
// counts them (srv-reqs/handoff, from INFO commandstats: client commands,
// Pub/Sub ones included, not the commands scripts run); and the wake-up
// messages published per handoff (pub/handoff). ns/op is the mean cycle
// (hold + release + handoff).
func BenchmarkHandoff(b *testing.B) {
	addr := testserver.Redis(b).Addr()
	for _, waiters := range []int{1, 8, 64} {
		for _, impl := range []string{implLocker, implLockerShared, implRaw, implRedislock, implRedsync} {
			b.Run(fmt.Sprintf("waiters=%d/impl=%s", waiters, impl), func(b *testing.B) {
				benchHandoff(b, addr, waiters, impl)
			})
		}
	}
}

// handoffHold is how long each holder keeps the lock in BenchmarkHandoff.
const handoffHold = 2 * time.Millisecond

func benchHandoff(b *testing.B, addr string, waiters int, impl string) {
	c := benchClient(b, addr)
	defer c.Close()
	admin := benchClient(b, addr)
	defer admin.Close()
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
	locks, closeAll := competitors(b, impl, c, key, waiters+1)
	defer closeAll()
	before := readCommandStats(b, ctx, admin)
	b.ResetTimer()
	for _, lock := range locks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				release, err := lock(ctx)
				if err != nil {
					return
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
				if err := release(context.Background()); err != nil {
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
	srv := readCommandStats(b, context.Background(), admin).sub(before)
	n := float64(len(samples) + 1)
	benchstats.ReportPercentiles(b, samples)
	b.ReportMetric(float64(reqs.n.Load())/n, "reqs/handoff")
	b.ReportMetric(float64(srv.clientCommands(sendsSet(impl)))/n, "srv-reqs/handoff")
	b.ReportMetric(float64(srv.published())/n, "pub/handoff")
}

// contendedHold is how long each holder keeps the lock in
// BenchmarkContended: about the critical section of a real job, and what
// issue 10 measured.
const contendedHold = time.Millisecond

// contention is a group of competitors (like separate processes, one
// goroutine each) of one implementation that take and give back one key,
// holding it contendedHold each time, with the requests they send.
type contention struct {
	benchstats.Contention
	b        *testing.B
	impl     string
	c        *goredis.Client
	admin    *goredis.Client
	closeAll func()
	reqs     *requestCounter
	srv      commandStats // totals over the phases run so far
}

func newContention(b *testing.B, addr string, n int, impl string) *contention {
	g := &contention{
		b: b, impl: impl, c: benchClient(b, addr), admin: benchClient(b, addr),
		reqs: &requestCounter{}, srv: commandStats{},
	}
	g.c.AddHook(g.reqs)
	locks, closeAll := competitors(b, impl, g.c, "bench/contended/"+randomID(), n)
	for _, l := range locks {
		g.Takes = append(g.Takes, benchstats.Take(l))
	}
	g.Hold, g.closeAll = contendedHold, closeAll
	return g
}

func (g *contention) close() {
	g.closeAll()
	_ = g.c.Close()
	_ = g.admin.Close()
}

// run makes n acquisitions, all goroutines competing, and adds them and
// the server's work to the totals.
func (g *contention) run(n int64) {
	ctx := context.Background()
	before := readCommandStats(g.b, ctx, g.admin)
	if err := g.Run(ctx, n); err != nil {
		g.b.Error(err)
	}
	for k, v := range readCommandStats(g.b, ctx, g.admin).sub(before) {
		g.srv[k] += v
	}
}

// warm lets every competitor take the key a few times, then forgets what
// that cost: what a long-running process pays once (connections, the
// eviction-policy check, the first subscription to the key) is not per
// acquisition.
func (g *contention) warm() {
	g.run(int64(3 * len(g.Takes)))
	g.reqs.n.Store(0)
	g.Reset()
	g.srv = commandStats{}
}

// report reports the group's metrics, each name suffixed with sfx.
func (g *contention) report(sfx string) {
	n := float64(g.Acquired)
	g.Report(g.b, sfx)
	g.b.ReportMetric(float64(g.reqs.n.Load())/n, "reqs/acq"+sfx)
	g.b.ReportMetric(float64(g.srv.clientCommands(sendsSet(g.impl)))/n, "srv-reqs/acq"+sfx)
	g.b.ReportMetric(float64(g.srv.published())/n, "pub/acq"+sfx)
}

// BenchmarkContended: 8 or 64 competitors (like separate processes, one
// goroutine each) take and give back one key as fast as they can, holding
// it contendedHold each time, after a warm-up (see contention.warm): Lockers,
// and raw, redislock and redsync (see competitors). ns/op is per
// acquisition; also reported: acquisitions per second (acq/s); requests per
// acquisition as the client counts them (reqs/acq: attempts, failed ones
// included, renewals and the release; Pub/Sub commands not counted) and as
// the server does (srv-reqs/acq, INFO commandstats: client commands, Pub/Sub
// ones included); the wake-ups published per acquisition (pub/acq); and
// fairness, the fewest acquisitions any competitor made over the most
// (share; 1 is perfectly fair). Run with -benchtime 3s or more: share needs
// many acquisitions per competitor to mean anything.
func BenchmarkContended(b *testing.B) {
	addr := testserver.Redis(b).Addr()
	for _, n := range []int{8, 64} {
		for _, impl := range []string{implLocker, implRaw, implRedislock, implRedsync} {
			b.Run(fmt.Sprintf("lockers=%d/impl=%s", n, impl), func(b *testing.B) {
				g := newContention(b, addr, n, impl)
				defer g.close()
				g.warm()
				b.ResetTimer()
				g.run(int64(b.N))
				b.StopTimer()
				g.report("")
			})
		}
	}
}

// BenchmarkContendedInterleaved compares 8 and 64 contending Lockers (two
// groups, each on a key of its own) in one loop, phase by phase (256
// acquisitions of one group, then 256 of the other), so that both see the
// same machine load. b.N acquisitions per group, rounded up to whole
// phases; the metrics of BenchmarkContended are reported for each (suffix
// -8 and -64), and throughput-64/8, the throughput of the 64 over that of
// the 8. A phase is a multiple of both group sizes, so that a fair lock
// gives each Locker the same number of turns in it, give or take the one
// that the start and the end of a phase can shift; share is the better
// measured by BenchmarkContended, which runs in one phase.
func BenchmarkContendedInterleaved(b *testing.B) {
	addr := testserver.Redis(b).Addr()
	const phase = 256
	g8, g64 := newContention(b, addr, 8, implLocker), newContention(b, addr, 64, implLocker)
	defer g8.close()
	defer g64.close()
	g8.warm()
	g64.warm()
	b.ResetTimer()
	for i, done := 0, 0; done < b.N; i, done = i+1, done+phase {
		benchstats.Rotated(i, func() { g8.run(phase) }, func() { g64.run(phase) })
	}
	b.StopTimer()
	g8.report("-8")
	g64.report("-64")
	b.ReportMetric(g64.Throughput()/g8.Throughput(), "throughput-64/8")
}

// BenchmarkCompareInterleaved runs 8 or 64 competitors of each of locker,
// raw, redislock and redsync (see competitors), each implementation on a key
// of its own, in phases of 256 acquisitions, rotating which implementation
// runs, so that all see the same machine load (while one runs, the others'
// goroutines are stopped). b.N acquisitions per implementation, rounded up
// to whole phases. The metrics of BenchmarkContended are reported for each,
// suffixed with its name, plus the handoff under contention: from the
// start of a release to the next acquisition by anyone, the releaser
// included (handoff-p50-µs, handoff-p99-µs); and the Locker's throughput
// and handoff p50 over each other's (locker/x-acq/s above 1 and
// locker/x-handoff-p50 below 1 favour the Locker).
func BenchmarkCompareInterleaved(b *testing.B) {
	addr := testserver.Redis(b).Addr()
	impls := []string{implLocker, implRaw, implRedislock, implRedsync}
	const phase = 256
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("lockers=%d", n), func(b *testing.B) {
			gs := make([]*contention, len(impls))
			sides := make([]func(), len(impls))
			for i, impl := range impls {
				g := newContention(b, addr, n, impl)
				defer g.close()
				g.warm()
				gs[i], sides[i] = g, func() { g.run(phase) }
			}
			b.ResetTimer()
			for i, done := 0, 0; done < b.N; i, done = i+1, done+phase {
				benchstats.Rotated(i, sides...)
			}
			b.StopTimer()
			for i, g := range gs {
				g.report("-" + impls[i])
			}
			for _, g := range gs[1:] {
				b.ReportMetric(gs[0].Throughput()/g.Throughput(), "locker/"+g.impl+"-acq/s")
				b.ReportMetric(float64(gs[0].HandoffP50())/float64(g.HandoffP50()), "locker/"+g.impl+"-handoff-p50")
			}
		})
	}
}
