package redis_test

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
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
//	cd integration && go test -run '^$' -bench . -benchtime 1000x ./redis

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

// BenchmarkLock runs the shared cases (conformance/benchmark) on the
// Locker (a Locker per contender, like separate processes) beside
// locker-shared (every contender on one Locker), the raw lock, redislock
// and redsync (see competitors) and, uncontended, raw-fenced: the least a
// lock with a fencing token costs (rawFencedAcquire, then the same
// compare-and-delete release). Each side has a client of its own
// (ContextTimeoutEnabled; BenchmarkLockPlainClient: the go-redis default),
// whose requests are counted (Pub/Sub commands aside).
//
//	cd integration && go test -run '^$' -bench '^BenchmarkLock$' -benchtime 1000x ./redis
func BenchmarkLock(b *testing.B) {
	benchLock(b, true, benchmark.Harness{Hold: handoffHold})
}

// BenchmarkLockPlainClient is BenchmarkLock's Uncontended case on plain
// clients (no ContextTimeoutEnabled).
func BenchmarkLockPlainClient(b *testing.B) {
	benchLock(b, false, benchmark.Harness{Waiters: []int{}, Clients: -1})
}

func benchLock(b *testing.B, ctxAware bool, h benchmark.Harness) {
	h.Sides = lockSides(b, testserver.Redis(b).Addr(), ctxAware)
	benchmark.Run(b, h)
}

// BenchmarkInstructions counts the client's instructions per uncontended
// Acquire+Release of each of BenchmarkLock's sides (valgrind's callgrind,
// in child processes on the same server; see benchmark.RunInstructions):
// the Locker's own client cost against raw-fenced's, whatever the
// loopback's speed; and locker-detached, a Locker whose requests all run off
// the caller's goroutine.
//
//	cd integration && go test -run '^$' -bench '^BenchmarkInstructions$' ./redis
func BenchmarkInstructions(b *testing.B) {
	addr := testserver.Redis(b).Addr()
	var sides []benchmark.Side
	for _, s := range lockSides(b, addr, true) {
		if s.Name != implLockerShared && s.Name != implRaw {
			sides = append(sides, s)
		}
	}
	dc := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 128})
	b.Cleanup(func() { _ = dc.Close() })
	sides = append(sides, benchmark.LockerSide("locker-detached", 1, func(testing.TB) locker.Locker { return redis.New(detachedClient{dc}) }))
	benchmark.RunInstructions(b, benchmark.Instructions{
		Sides: sides, Env: []string{testserver.EnvRedisAddr + "=" + addr},
		// The Locker's first requests under callgrind take longer than
		// inlineWait/2: it then sends requests off the caller's goroutine
		// for 10s (see redis/exec.go), not its usual path.
		Settle: 11 * time.Second, Runs: 2,
	})
}

// detachedClient hides the *goredis.Client's type from redis.New, which
// then sends every request off the caller's goroutine (see redis/exec.go):
// the path a Locker takes for 10s after a slow reply, and always with a
// client type it does not know.
type detachedClient struct{ *goredis.Client }

// lockSides are BenchmarkLock's sides on the server at addr.
func lockSides(b *testing.B, addr string, ctxAware bool) []benchmark.Side {
	client := func() (*goredis.Client, *requestCounter) {
		c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: ctxAware, PoolSize: 128})
		b.Cleanup(func() { _ = c.Close() })
		reqs := &requestCounter{}
		c.AddHook(reqs)
		return c, reqs
	}
	side := func(impl string) benchmark.Side {
		c, reqs := client()
		if impl == implLockerShared {
			s := benchmark.LockerSide(impl, 1, func(testing.TB) locker.Locker { return redis.New(c) })
			s.Requests = reqs.n.Load
			return s
		}
		return benchmark.Side{Name: impl, Requests: reqs.n.Load, New: func(tb testing.TB, key string, _ int) benchmark.Lock {
			locks, closeAll := competitors(tb, impl, c, key, 1)
			tb.Cleanup(closeAll)
			return benchmark.Lock(locks[0])
		}}
	}
	fc, freqs := client()
	fenced := benchmark.Side{Name: implRawFenced, Floor: true, Requests: freqs.n.Load, New: func(_ testing.TB, key string, _ int) benchmark.Lock {
		fid := randomID() // one hash tag: the script's two keys share a Cluster slot
		lockKey, fenceKey := "bench/{"+fid+"}/"+key, "bench/{"+fid+"}/fence"
		return func(ctx context.Context) (func(context.Context) error, error) {
			owner := randomID()
			token, err := rawFencedAcquire.Run(ctx, fc, []string{lockKey, fenceKey}, owner, 30000).Int64()
			if err != nil || token <= 0 {
				return nil, fmt.Errorf("fenced acquire: not taken (token %d, %v); nobody else uses the key", token, err)
			}
			return func(ctx context.Context) error { return rawUnlock(ctx, fc, lockKey, owner) }, nil
		}
	}}
	return []benchmark.Side{side(implLocker), side(implLockerShared), side(implRaw), fenced, side(implRedislock), side(implRedsync)}
}

// BenchmarkSemaphore: a semaphore of 4 and the mutex, each contended by
// 16 Lockers (separate processes: a Locker each, one goroutine each, on
// one key per group), holding what they get for contendedHold, in one loop
// phase by phase (256 acquisitions of one group, then 256 of the other) so
// that both see the same machine load, after a warm-up. Reported for each
// (suffix -sem4 and -mutex), as BenchmarkContendedScaling does:
// acquisitions per second, share (fewest acquisitions of a Locker over the
// most), the handoff p50 and p99, requests per acquisition (client and
// server counts) and wake-ups published per acquisition; and sem4/mutex,
// the semaphore's throughput over the mutex's (at most 4: four holders at
// once where the mutex has one).
//
//	cd integration && go test -run '^$' -bench '^BenchmarkSemaphore$' -benchtime 4096x ./redis
func BenchmarkSemaphore(b *testing.B) {
	addr := testserver.Redis(b).Addr()
	const phase, clients = 256, 16
	sem, mutex := newContention(b, addr, clients, implSemaphore4), newContention(b, addr, clients, implLocker)
	defer sem.close()
	defer mutex.close()
	sem.warm()
	mutex.warm()
	b.ResetTimer()
	for i, done := 0, 0; done < b.N; i, done = i+1, done+phase {
		benchstats.Rotated(i, func() { sem.run(phase) }, func() { mutex.run(phase) })
	}
	b.StopTimer()
	sem.report("-sem4")
	mutex.report("-mutex")
	b.ReportMetric(sem.Throughput()/mutex.Throughput(), "sem4/mutex")
}

// Implementations the handoff and contention benchmarks compare.
const (
	implLocker       = "locker"        // a Locker for each competitor, like separate processes
	implLockerShared = "locker-shared" // every competitor on one Locker
	implRaw          = "raw"           // SET NX PX polled every rawPoll, compare-and-delete
	implRedislock    = "redislock"     // bsm/redislock, retrying every rawPoll
	implRedsync      = "redsync"       // go-redsync/redsync v4 on one pool, retrying every rawPoll
	implRawFenced    = "raw-fenced"    // rawFencedAcquire retried every rawPoll, compare-and-delete (BenchmarkScale)
	implSemaphore4   = "semaphore-4"   // a permit of a semaphore of 4, a Locker for each competitor
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
func competitors(b testing.TB, impl string, c *goredis.Client, key string, n int) ([]lockFunc, func()) {
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
		case implSemaphore4:
			l := redis.New(c)
			lockers = append(lockers, l)
			fs[i] = func(ctx context.Context) (func(context.Context) error, error) {
				h, err := l.AcquireSemaphore(ctx, key, 4)
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

// handoffHold is how long each holder keeps the lock in BenchmarkLock's
// Handoff and Contended cases, once the others wait.
const handoffHold = 2 * time.Millisecond

// contendedHold is how long each holder keeps the lock in
// BenchmarkContendedScaling: about the critical section of a real job, and
// what issue 10 measured.
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

// BenchmarkContendedScaling compares 8 and 64 contending Lockers (two
// groups, each on a key of its own) in one loop, phase by phase (256
// acquisitions of one group, then 256 of the other), so that both see the
// same machine load, after a warm-up (see contention.warm): issue 10's
// targets. b.N acquisitions per group, rounded up to whole phases.
// Reported for each (suffix -8 and -64): acquisitions per second (acq/s),
// share (fewest acquisitions of a Locker over the most), the handoff p50
// and p99, requests per acquisition as the client counts them (reqs/acq:
// attempts, renewals and the release; Pub/Sub commands not counted) and as
// the server does (srv-reqs/acq, INFO commandstats: client commands,
// Pub/Sub ones included), the wake-ups published per acquisition
// (pub/acq); and throughput-64/8, the throughput of the 64 over that of
// the 8. A phase is a multiple of both group sizes, so that a fair lock
// gives each Locker the same number of turns in it, give or take the one
// that the start and the end of a phase can shift.
func BenchmarkContendedScaling(b *testing.B) {
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
