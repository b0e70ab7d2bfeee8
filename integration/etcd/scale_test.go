package etcd_test

import (
	"context"
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/etcd"
	"github.com/go-locker/locker/integration/testserver"
)

// BenchmarkScale is the shared Scale case (conformance/benchmark.RunScale)
// on the Locker (a Locker per client, like separate processes) beside
// etcd's concurrency.Mutex (a session per client), every client on an etcd
// client of its own whose requests are counted (KV, Lease and Watch
// calls), on the one test server, phase by phase. Two shapes: 8 clients on
// one key (a contended acquisition) and 64 clients on 1,000 keys (a random
// key each time), each holder keeping its lock 1ms. srv-cpu-µs/acq is the
// server container's CPU (the engine's stats) over each side's phases
// divided by the acquisitions made in them.
//
//	cd integration && go test -run '^$' -bench '^BenchmarkScale$' -benchtime 2000x ./etcd
func BenchmarkScale(b *testing.B) {
	srv := testserver.Etcd(b)
	for _, shape := range []struct{ keys, clients int }{{1, 8}, {1000, 64}} {
		b.Run(fmt.Sprintf("keys=%d,clients=%d", shape.keys, shape.clients), func(b *testing.B) {
			var lockerRPC, mutexRPC rpcCounter
			client := func(tb testing.TB, rc *rpcCounter) *clientv3.Client {
				cli := newEtcdClient(tb, srv.Addr())
				rc.count(cli)
				return cli
			}
			benchmark.RunScale(b, benchmark.Scale{
				Keys: shape.keys, Clients: shape.clients, Usage: testserver.ScaleUsage(srv),
				Sides: []benchmark.ScaleSide{
					{Name: "locker", Requests: lockerRPC.n.Load, Client: benchmark.LockerClient(func(tb testing.TB) locker.Locker {
						return etcd.New(client(tb, &lockerRPC))
					})},
					{Name: "mutex", Requests: mutexRPC.n.Load, Client: func(tb testing.TB, _ int) benchmark.Client {
						s, err := concurrency.NewSession(client(tb, &mutexRPC), concurrency.WithTTL(10))
						if err != nil {
							tb.Fatal(err)
						}
						tb.Cleanup(func() { _ = s.Close() })
						return func(key string) benchmark.Lock {
							return func(ctx context.Context) (func(context.Context) error, error) {
								m := concurrency.NewMutex(s, "/"+key)
								if err := m.Lock(ctx); err != nil {
									return nil, err
								}
								return m.Unlock, nil
							}
						}
					}},
				},
			})
		})
	}
}
