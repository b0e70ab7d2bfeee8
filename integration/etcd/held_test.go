package etcd_test

import (
	"testing"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/etcd"
	"github.com/go-locker/locker/integration/testserver"
)

// heldEtcd is the Held case on a Locker of its own client. Its requests
// are not counted: the locks of one TTL share one lease, kept alive by one
// stream (etcd/doc.go), whatever the number held.
func heldEtcd(tb testing.TB, n int) benchmark.Held {
	addr := testserver.Etcd(tb).Addr()
	return benchmark.Held{N: n, Open: func(tb testing.TB) locker.Locker {
		l := etcd.New(newEtcdClient(tb, addr))
		tb.Cleanup(func() { _ = l.Close() })
		return l
	}}
}

// TestHeldGoroutines: a Locker holding 2,000 locks runs no more goroutines
// than one holding 128: the watches on the holders' keys share one stream
// of the Locker's, read by one goroutine (etcd/heldwatch.go), not a
// clientv3 watcher and a goroutine of ours each.
func TestHeldGoroutines(t *testing.T) { benchmark.CheckHeldGoroutines(t, heldEtcd(t, 2000)) }

// BenchmarkHeld: 10,000 locks held by one Locker (TTL 30s).
//
//	cd integration && go test -run '^$' -bench '^BenchmarkHeld$' -benchtime 1x ./etcd
func BenchmarkHeld(b *testing.B) { benchmark.RunHeld(b, heldEtcd(b, 10000)) }
