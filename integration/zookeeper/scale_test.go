package zookeeper_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/zookeeper"
)

// BenchmarkScale is the shared Scale case (conformance/benchmark.RunScale)
// on the Locker (a Locker per client, like separate processes) beside
// go-zookeeper's zk.Lock (a connection per client), on the one test
// server, phase by phase. Two shapes: 8 clients on one key (a contended
// acquisition) and 64 clients on 1,000 keys (a random key each time),
// each holder keeping its lock handoffHold (ZooKeeper syncs every write to
// its log). srv-cpu-µs/acq is the server container's CPU (the engine's
// stats) over each side's phases divided by the acquisitions made in
// them. Requests are not counted (go-zookeeper has no hook for them).
//
//	cd integration && go test -run '^$' -bench '^BenchmarkScale$' -benchtime 2000x ./zookeeper
func BenchmarkScale(b *testing.B) {
	srv := testserver.ZooKeeper(b)
	addr := srv.Addr()
	for _, shape := range []struct{ keys, clients int }{{1, 8}, {1000, 64}} {
		b.Run(fmt.Sprintf("keys=%d,clients=%d", shape.keys, shape.clients), func(b *testing.B) {
			benchmark.RunScale(b, benchmark.Scale{
				Keys: shape.keys, Clients: shape.clients, Hold: handoffHold, Usage: testserver.ScaleUsage(srv),
				Sides: []benchmark.ScaleSide{
					{Name: "locker", Client: benchmark.LockerClient(func(tb testing.TB) locker.Locker { return benchLocker(tb, addr) })},
					{Name: "zk.Lock", Client: func(tb testing.TB, _ int) benchmark.Client {
						c := benchConn(tb, addr)
						return func(key string) benchmark.Lock {
							return func(context.Context) (func(context.Context) error, error) {
								lk := zk.NewLock(c, zookeeper.LockDir("/locker-zklock", key), zk.WorldACL(zk.PermAll))
								if err := lk.Lock(); err != nil {
									return nil, err
								}
								return func(context.Context) error { return lk.Unlock() }, nil
							}
						}
					}},
				},
			})
		})
	}
}
