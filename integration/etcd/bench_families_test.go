package etcd_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/etcd"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/internal/benchstats"
)

// BenchmarkSemaphore: contended throughput of a semaphore of 4 with 16
// clients (each an etcd client and a Locker of its own, like separate
// processes), beside the mutex of the same Lockers on the same server,
// interleaved: phases of 128 acquisitions, one side after the other, which
// side goes first rotating. Each holder keeps its permit or lock for hold:
// 1ms (the handoff is all there is) and 20ms (work worth a semaphore).
// Reported per side: acquisitions per second, the most holders seen at
// once, the share (fewest acquisitions of a client over the most: 1 is
// fair), and requests per acquisition; and the semaphore's throughput over
// the mutex's. (conformance/benchmark's Group fails on two holders at once,
// so a semaphore does not fit it.)
//
//	cd integration && go test -run '^$' -bench '^BenchmarkSemaphore$' -benchtime 1024x ./etcd
func BenchmarkSemaphore(b *testing.B) {
	addr := testserver.Etcd(b).Addr()
	for _, hold := range []time.Duration{time.Millisecond, 20 * time.Millisecond} {
		b.Run(fmt.Sprintf("n=4/clients=16/hold=%v", hold), func(b *testing.B) { benchSemaphore(b, addr, hold) })
	}
}

func benchSemaphore(b *testing.B, addr string, hold time.Duration) {
	const (
		clients = 16
		n       = 4
		phase   = 128
	)
	type side struct {
		name     string
		locks    []locker.Locker
		rc       rpcCounter
		elapsed  time.Duration
		acquired int
		counts   []int
		most     int32
	}
	sides := []*side{{name: "semaphore"}, {name: "mutex"}}
	for _, s := range sides {
		s.counts = make([]int, clients)
		for range clients {
			cli := newEtcdClient(b, addr)
			s.rc.count(cli)
			l := etcd.New(cli)
			b.Cleanup(func() { _ = l.Close() })
			if s.name == "semaphore" {
				s.locks = append(s.locks, locker.Semaphore(l, n))
			} else {
				s.locks = append(s.locks, l)
			}
		}
	}
	ctx := context.Background()
	// run makes count acquisitions of s's key, by its clients at once.
	run := func(s *side, key string, count int, record bool) {
		var (
			left   atomic.Int64
			inside atomic.Int32
			wg     sync.WaitGroup
			mu     sync.Mutex
			errs   []error
		)
		left.Store(int64(count))
		start := time.Now()
		for i, l := range s.locks {
			wg.Go(func() {
				for left.Add(-1) >= 0 {
					h, err := l.Acquire(ctx, key)
					if err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						return
					}
					in := inside.Add(1)
					if record {
						mu.Lock()
						s.counts[i]++
						s.most = max(s.most, in)
						mu.Unlock()
					}
					time.Sleep(hold)
					inside.Add(-1)
					if err := h.Release(ctx); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						return
					}
				}
			})
		}
		wg.Wait()
		if record {
			s.elapsed += time.Since(start)
			s.acquired += count
		}
		if len(errs) > 0 {
			b.Fatalf("%s: %v", s.name, errs[0])
		}
	}
	keys := make([]string, len(sides))
	for i, s := range sides {
		keys[i] = fmt.Sprintf("bench/%s/%s/%d", b.Name(), s.name, time.Now().UnixNano())
		run(s, keys[i], 2*clients, false) // warm up: leases, connections
	}
	before := make([]int64, len(sides))
	for i, s := range sides {
		before[i] = s.rc.n.Load()
	}
	b.ResetTimer()
	for i, done := 0, 0; done < b.N; i, done = i+1, done+phase {
		runs := make([]func(), len(sides))
		for j, s := range sides {
			runs[j] = func() { run(s, keys[j], min(phase, b.N-done), true) }
		}
		benchstats.Rotated(i, runs...)
	}
	b.StopTimer()
	tput := make([]float64, len(sides))
	for i, s := range sides {
		tput[i] = float64(s.acquired) / s.elapsed.Seconds()
		b.ReportMetric(tput[i], s.name+"-acq/s")
		b.ReportMetric(float64(s.most), s.name+"-most-holders")
		b.ReportMetric(float64(slices.Min(s.counts))/float64(max(slices.Max(s.counts), 1)), s.name+"-share")
		b.ReportMetric(float64(s.rc.n.Load()-before[i])/float64(max(s.acquired, 1)), s.name+"-reqs/acq")
	}
	b.ReportMetric(tput[0]/tput[1], "semaphore/mutex-acq/s")
	b.ReportMetric(0, "ns/op")
}
