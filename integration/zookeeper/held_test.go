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

// TestHeldGoroutines: a Locker (Connect) holding 2,000 locks runs no more
// goroutines than one holding 128: the watches on the holders' nodes are
// routed by the session's event callback to its supervisor, not each
// waited on by a goroutine of its own. The watches are set watchDelay after
// each acquisition: the count is taken after they all are.
func TestHeldGoroutines(t *testing.T) { benchmark.CheckHeldGoroutines(t, heldZooKeeper(t, 2000)) }

// TestHeldGoroutinesNew: the same for a Locker on your connection
// (zookeeper.New), whose events channel it reads but on which it cannot
// register a callback: the watch events reach its supervisor through the
// channel, and a sweep of the watches' own channels catches those the
// channel dropped.
func TestHeldGoroutinesNew(t *testing.T) {
	addr := testserver.ZooKeeper(t).Addr()
	benchmark.CheckHeldGoroutines(t, benchmark.Held{N: 2000, TTL: 10 * time.Second, Open: func(tb testing.TB) locker.Locker {
		conn, events, err := zk.Connect([]string{addr}, 10*time.Second, zk.WithLogger(quiet{}))
		if err != nil {
			tb.Fatalf("zk.Connect: %v", err)
		}
		l := zookeeper.New(conn, events, zookeeper.WithSessionTimeout(10*time.Second))
		tb.Cleanup(func() { _ = l.Close(); conn.Close() })
		return l
	}})
}

// BenchmarkHeld: 10,000 locks held by one Locker (sessions of 10s).
//
//	cd integration && go test -run '^$' -bench '^BenchmarkHeld$' -benchtime 1x ./zookeeper
func BenchmarkHeld(b *testing.B) { benchmark.RunHeld(b, heldZooKeeper(b, 10000)) }
