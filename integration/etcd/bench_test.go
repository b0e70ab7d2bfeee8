package etcd_test

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/etcd"
	"github.com/go-locker/locker/integration/testserver"
)

// BenchmarkLock runs the shared cases (conformance/benchmark) on the
// Locker beside etcd's concurrency.Mutex (a session of its own per
// contender) and, uncontended, the floor: one Txn that puts the key on a
// lease if it is absent, and its Delete. Every contender has an etcd client
// of its own (like separate processes), whose requests (KV, Lease and Watch
// calls, keep-alives included) are counted.
//
//	cd integration && go test -run '^$' -bench '^BenchmarkLock$' -benchtime 400x ./etcd
func BenchmarkLock(b *testing.B) {
	benchmark.Run(b, benchmark.Harness{Sides: lockSides(testserver.Etcd(b).Addr())})
}

// BenchmarkInstructions counts the client's instructions per uncontended
// Acquire+Release under valgrind's callgrind (benchmark.RunInstructions:
// the test binary runs again as a child per side, on this run's server)
// for BenchmarkLock's sides: a figure of the client's own cost that neither
// the loopback nor the machine's load moves.
//
//	cd integration && go test -run '^$' -bench '^BenchmarkInstructions$' ./etcd
func BenchmarkInstructions(b *testing.B) {
	addr := testserver.Etcd(b).Addr()
	benchmark.RunInstructions(b, benchmark.Instructions{
		Sides: lockSides(addr), Runs: 2,
		Env: []string{testserver.EnvEtcdAddr + "=" + addr},
	})
}

// lockSides are BenchmarkLock's sides on the etcd server at addr.
func lockSides(addr string) []benchmark.Side {
	var lockerRPC, mutexRPC, floorRPC rpcCounter
	client := func(tb testing.TB, rc *rpcCounter) *clientv3.Client {
		cli := newEtcdClient(tb, addr)
		rc.count(cli)
		return cli
	}
	lockerSide := benchmark.LockerSide("locker", 0, func(tb testing.TB) locker.Locker { return etcd.New(client(tb, &lockerRPC)) })
	lockerSide.Requests = lockerRPC.n.Load
	return []benchmark.Side{
		lockerSide,
		{Name: "mutex", Requests: mutexRPC.n.Load, New: func(tb testing.TB, key string, _ int) benchmark.Lock {
			s, err := concurrency.NewSession(client(tb, &mutexRPC), concurrency.WithTTL(10))
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { _ = s.Close() })
			m := concurrency.NewMutex(s, "/"+key)
			return func(ctx context.Context) (func(context.Context) error, error) {
				if err := m.Lock(ctx); err != nil {
					return nil, err
				}
				return m.Unlock, nil
			}
		}},
		{Name: "floor", Floor: true, Requests: floorRPC.n.Load, New: func(tb testing.TB, key string, _ int) benchmark.Lock {
			cli := client(tb, &floorRPC)
			// The floor's lease outlasts the benchmark without keep-alives.
			g, err := cli.Grant(context.Background(), 3600)
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { _, _ = cli.Revoke(context.Background(), g.ID) })
			key = "/" + key
			return func(ctx context.Context) (func(context.Context) error, error) {
				_, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
					Then(clientv3.OpPut(key, "", clientv3.WithLease(g.ID))).Commit()
				if err != nil {
					return nil, err
				}
				return func(ctx context.Context) error { _, err := cli.Delete(ctx, key); return err }, nil
			}
		}},
	}
}
