package redlock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis/redlock"
)

// BenchmarkScale is the shared Scale case (conformance/benchmark.RunScale)
// on this package's Locker on 3 nodes (a Locker per client, like separate
// processes) beside go-redsync/redsync v4 on the same nodes (an instance
// per client, retrying every millisecond: its default 50-250ms delay would
// leave the lock idle most of the time), every client on node clients of
// its own whose round trips are counted (reqs/acq: over all nodes), phase
// by phase. Two shapes: 8 clients on one key (a contended acquisition) and
// 64 clients on 1,000 keys (a random key each time), each holder keeping
// its lock 1ms. The server figures are the three nodes' INFO cpu and
// commandstats, summed (testserver.RedisUsage).
//
//	cd integration && go test -run '^$' -bench '^BenchmarkScale$' -benchtime 2000x ./redlock
func BenchmarkScale(b *testing.B) {
	addrs := nodeAddrs(b, 3)
	for _, shape := range []struct{ keys, clients int }{{1, 8}, {1000, 64}} {
		b.Run(fmt.Sprintf("keys=%d,clients=%d", shape.keys, shape.clients), func(b *testing.B) {
			var lockerRT, redsyncRT roundTrips
			clients := func(tb testing.TB, rt *roundTrips) []*goredis.Client {
				cs := benchClients(tb, addrs)
				for _, c := range cs {
					c.AddHook(rt)
				}
				return cs
			}
			benchmark.RunScale(b, benchmark.Scale{
				Keys: shape.keys, Clients: shape.clients, Usage: testserver.RedisUsage(b, addrs...),
				Sides: []benchmark.ScaleSide{
					{Name: "redlock", Requests: lockerRT.trips.Load, Client: benchmark.LockerClient(func(tb testing.TB) locker.Locker {
						return redlock.New(clients(tb, &lockerRT))
					})},
					{Name: "redsync", Requests: redsyncRT.trips.Load, Client: func(tb testing.TB, _ int) benchmark.Client {
						rs := newRedsync(clients(tb, &redsyncRT))
						return func(key string) benchmark.Lock {
							return func(ctx context.Context) (func(context.Context) error, error) {
								m := rs.NewMutex(key, redsync.WithTries(1<<20), redsync.WithRetryDelay(time.Millisecond))
								if err := m.LockContext(ctx); err != nil {
									return nil, err
								}
								return func(ctx context.Context) error { _, err := m.UnlockContext(ctx); return err }, nil
							}
						}
					}},
				},
			})
		})
	}
}
