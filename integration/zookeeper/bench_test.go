package zookeeper_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/zookeeper"
)

func benchConn(b testing.TB, addr string) *zk.Conn {
	b.Helper()
	c, events, err := zk.Connect([]string{addr}, sessionTimeout, zk.WithLogger(quiet{}))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	for ev := range events {
		if ev.State == zk.StateHasSession {
			break
		}
	}
	return c
}

func benchLocker(b testing.TB, addr string) *zookeeper.Locker {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := zookeeper.Connect(ctx, []string{addr}, zookeeper.WithDefaultTTL(sessionTimeout))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	return l
}

// BenchmarkLock runs the shared cases (conformance/benchmark) on the
// Locker beside go-zookeeper's zk.Lock and, uncontended, the raw floor (the
// create of an ephemeral sequential node, then its delete), every
// contender on a connection of its own straight to the server (no proxy).
// ZooKeeper fsyncs its transaction log, so every write costs a disk flush
// on a disk shared with whatever else runs: the interleaving matters. A
// holder keeps the lock handoffHold, long enough for the previous holder
// to be queued again (its create written to disk) before the release.
//
//	cd integration && go test -run '^$' -bench '^BenchmarkLock$' -benchtime 400x ./zookeeper
func BenchmarkLock(b *testing.B) {
	benchmark.Run(b, benchmark.Harness{Hold: handoffHold, Sides: lockSides(testserver.ZooKeeper(b).Addr())})
}

// BenchmarkInstructions counts the client's instructions per uncontended
// Acquire+Release under valgrind's callgrind (benchmark.RunInstructions:
// the test binary runs again as a child per side, on this run's server)
// for BenchmarkLock's sides: a figure of the client's own cost that neither
// the loopback nor the machine's load moves. (The sessions' pings, which
// come with time and not with cycles, are counted too.)
//
//	cd integration && go test -run '^$' -bench '^BenchmarkInstructions$' ./zookeeper
func BenchmarkInstructions(b *testing.B) {
	addr := testserver.ZooKeeper(b).Addr()
	benchmark.RunInstructions(b, benchmark.Instructions{
		Sides: lockSides(addr), Runs: 2,
		Env: []string{testserver.EnvZooKeeperAddr + "=" + addr},
	})
}

// lockSides are BenchmarkLock's sides on the ZooKeeper server at addr.
func lockSides(addr string) []benchmark.Side {
	return []benchmark.Side{
		benchmark.LockerSide("locker", 0, func(tb testing.TB) locker.Locker { return benchLocker(tb, addr) }),
		{Name: "zk.Lock", New: func(tb testing.TB, key string, _ int) benchmark.Lock {
			lk := zk.NewLock(benchConn(tb, addr), zookeeper.LockDir("/locker-zklock", key), zk.WorldACL(zk.PermAll))
			return func(context.Context) (func(context.Context) error, error) {
				if err := lk.Lock(); err != nil {
					return nil, err
				}
				return func(context.Context) error { return lk.Unlock() }, nil
			}
		}},
		{Name: "raw", Floor: true, New: func(tb testing.TB, key string, _ int) benchmark.Lock {
			ctx := context.Background()
			h, err := benchLocker(tb, addr).Acquire(ctx, key) // makes the directory
			if err != nil {
				tb.Fatal(err)
			}
			_ = h.Release(ctx)
			c := benchConn(tb, addr)
			// A GUID-protected name, like the other two create.
			prefix := zookeeper.LockDir("", key) + "/_c_0123456789abcdef0123456789abcdef-lock-"
			return func(context.Context) (func(context.Context) error, error) {
				p, err := c.Create(prefix, nil, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
				if err != nil {
					return nil, err
				}
				return func(context.Context) error { return c.Delete(p, -1) }, nil
			}
		}},
	}
}

// BenchmarkSemaphore runs the shared cases on a semaphore of 4 (through
// locker.Semaphore) beside the mutex of the same Locker type, interleaved
// on the same server, every contender a Locker of its own: Contended with
// 16 clients is the figure asked for (the semaphore's acquisitions per
// second over the mutex's, each holder keeping its permit or lock
// handoffHold); Uncontended shows the cost of a permit alone.
//
//	cd integration && go test -run '^$' -bench '^BenchmarkSemaphore$' -benchtime 512x ./zookeeper
func BenchmarkSemaphore(b *testing.B) {
	const n = 4
	addr := testserver.ZooKeeper(b).Addr()
	sem := benchmark.LockerSide("semaphore-4", 0, func(tb testing.TB) locker.Locker { return locker.Semaphore(benchLocker(tb, addr), n) })
	sem.Limit = n
	benchmark.Run(b, benchmark.Harness{Hold: handoffHold, Waiters: []int{}, Clients: 16, Sides: []benchmark.Side{
		sem,
		benchmark.LockerSide("mutex", 0, func(tb testing.TB) locker.Locker { return benchLocker(tb, addr) }),
	}})
}

// handoffHold is how long a holder keeps the lock in BenchmarkLock.
const handoffHold = 5 * time.Millisecond

var _ locker.Locker = (*zookeeper.Locker)(nil)
