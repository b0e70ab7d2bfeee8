package zookeeper_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/zookeeper"
)

// heldZooKeeper is the Held case on a Locker of its own. Its requests are
// not counted: a lock's lease is its session (one per TTL), kept by the
// session's pings, whatever the number held.
func heldZooKeeper(tb testing.TB, n int) benchmark.Held {
	addr := testserver.ZooKeeper(tb).Addr()
	// The test server grants sessions of 10s at most.
	return benchmark.Held{N: n, TTL: 10 * time.Second, Open: func(tb testing.TB) locker.Locker {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		l, err := zookeeper.Connect(ctx, []string{addr})
		if err != nil {
			tb.Fatalf("zookeeper.Connect: %v", err)
		}
		tb.Cleanup(func() { _ = l.Close() })
		return l
	}}
}

// BenchmarkHeld: 10,000 locks held by one Locker (sessions of 10s). No test
// holds ZooKeeper to "no goroutine per held lock" yet: it runs one per lock
// today (the watch of its node; BENCHMARKS.md, "Scale").
//
//	cd integration && go test -run '^$' -bench '^BenchmarkHeld$' -benchtime 1x ./zookeeper
func BenchmarkHeld(b *testing.B) { benchmark.RunHeld(b, heldZooKeeper(b, 10000)) }
