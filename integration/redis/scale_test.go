package redis_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-redsync/redsync/v4"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis"
)

// BenchmarkScale is the shared Scale case (conformance/benchmark.RunScale)
// on the Locker (a Locker per client, like separate processes) beside
// redsync (an instance per client, retrying every rawPoll) and raw-fenced
// (the least a lock with a fencing token costs: rawFencedAcquire, retried
// every rawPoll, and the compare-and-delete release), each side on a
// go-redis client of its own whose requests are counted, on the one test
// server, phase by phase. Two shapes:
//
//	keys=1,clients=8        8 clients on one key, each holding 1ms: the
//	                        cost of a contended acquisition
//	keys=1000,clients=64    64 clients on 1000 keys (a random key each
//	                        time), holding 1ms
//
// The server's CPU per acquisition (srv-cpu-µs/acq) is INFO CPU's
// used_cpu_user + used_cpu_sys over each side's phases divided by the
// acquisitions made in them; srv-cmds/acq is INFO commandstats' calls
// (the commands scripts run inside EVALSHA included) likewise, and
// srv-script-µs/acq the usec of EVALSHA and EVAL there: the part of the
// server's CPU spent in scripts.
//
//	cd integration && go test -run '^$' -bench 'BenchmarkScale' -benchtime 4000x ./redis
//
// (about 20s for both shapes; BENCHMARKS.md, "Scale").
func BenchmarkScale(b *testing.B) {
	addr := testserver.Redis(b).Addr()
	usage := testserver.RedisUsage(b, addr)
	for _, shape := range []struct{ keys, clients int }{{1, 8}, {1000, 64}} {
		b.Run(fmt.Sprintf("keys=%d,clients=%d", shape.keys, shape.clients), func(b *testing.B) {
			benchmark.RunScale(b, benchmark.Scale{
				Keys: shape.keys, Clients: shape.clients, Hold: contendedHold, Usage: usage,
				Sides: []benchmark.ScaleSide{scaleSide(b, addr, implLocker), scaleSide(b, addr, implRedsync), scaleSide(b, addr, implRawFenced)},
			})
		})
	}
}

// scaleSide is impl's side of BenchmarkScale, on a client of its own.
func scaleSide(b *testing.B, addr, impl string) benchmark.ScaleSide {
	c := benchClient(b, addr)
	b.Cleanup(func() { _ = c.Close() })
	reqs := &requestCounter{}
	c.AddHook(reqs)
	s := benchmark.ScaleSide{Name: impl, Requests: reqs.n.Load}
	switch impl {
	case implLocker:
		s.Client = benchmark.LockerClient(func(testing.TB) locker.Locker { return redis.New(c) })
	case implRedsync:
		s.Client = func(testing.TB, int) benchmark.Client {
			rs := redsync.New(rsgoredis.NewPool(c))
			return func(key string) benchmark.Lock {
				return func(ctx context.Context) (func(context.Context) error, error) {
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
			}
		}
	case implRawFenced:
		s.Client = func(testing.TB, int) benchmark.Client {
			return func(key string) benchmark.Lock {
				lockKey, fenceKey := "bench/{"+key+"}/lock", "bench/{"+key+"}/fence"
				return func(ctx context.Context) (func(context.Context) error, error) {
					owner := randomID()
					for {
						token, err := rawFencedAcquire.Run(ctx, c, []string{lockKey, fenceKey}, owner, benchTTL.Milliseconds()).Int64()
						if err == nil && token > 0 {
							return func(ctx context.Context) error { return rawUnlock(ctx, c, lockKey, owner) }, nil
						}
						if err != nil && !errors.Is(err, goredis.Nil) {
							return nil, err
						}
						select {
						case <-time.After(rawPoll):
						case <-ctx.Done():
							return nil, ctx.Err()
						}
					}
				}
			}
		}
	default:
		b.Fatalf("no scale side for %q", impl)
	}
	return s
}
