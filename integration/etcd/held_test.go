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

// BenchmarkHeld: 10,000 locks held by one Locker (TTL 30s). No test holds
// etcd to "no goroutine per held lock" yet: it runs three per lock today (a
// watch of each key; BENCHMARKS.md, "Scale").
//
//	cd integration && go test -run '^$' -bench '^BenchmarkHeld$' -benchtime 1x ./etcd
func BenchmarkHeld(b *testing.B) { benchmark.RunHeld(b, heldEtcd(b, 10000)) }
