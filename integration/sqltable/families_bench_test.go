package sqltable_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// BenchmarkFamilies measures contended throughput: a semaphore of 4
// permits under 16 clients against the mutex under 16 clients, on the same
// database, interleaved (phases of famPhase acquisitions, one side after
// the other, the first rotating), each side's clients spread over 8
// Lockers opened by URL with pools of their own, like processes; a holder
// keeps its lock for 1ms. (conformance/benchmark's Group checks that one
// holder at a time holds, which a semaphore is not.) It reports each
// side's acquisitions per second, their ratio, the share (fewest
// acquisitions of a client over the most: 1 is fair) and the most holders
// seen at once (at most 4 and 1).
//
//	cd integration && go test -run '^$' -bench 'BenchmarkFamilies' -benchtime 1024x ./sqltable
func BenchmarkFamilies(b *testing.B) {
	for _, d := range dialects {
		b.Run(d.name, func(b *testing.B) {
			sides := []*famSide{
				newFamSide(b, d, "semaphore4", 4),
				newFamSide(b, d, "mutex", 1),
			}
			ctx := context.Background()
			for _, s := range sides {
				s.phase(b, ctx, 64) // warm-up: connections, statements
				s.reset()
			}
			b.ResetTimer()
			for i, done := 0, 0; done < b.N; i, done = i+1, done+famPhase {
				for j := range sides {
					sides[(i+j)%len(sides)].phase(b, ctx, min(famPhase, b.N-done))
				}
			}
			b.StopTimer()
			tput := make([]float64, len(sides))
			for i, s := range sides {
				tput[i] = float64(s.acquired) / s.elapsed.Seconds()
				b.ReportMetric(tput[i], s.name+"-acq/s")
				b.ReportMetric(float64(slices.Min(s.counts))/float64(max(slices.Max(s.counts), 1)), s.name+"-share")
				b.ReportMetric(float64(s.most.Load()), s.name+"-most-holders")
				if s.most.Load() > int32(s.n) {
					b.Errorf("%s: %d holders at once, limit %d", s.name, s.most.Load(), s.n)
				}
			}
			b.ReportMetric(tput[0]/tput[1], "semaphore4/mutex-acq/s")
		})
	}
}

const (
	famPhase   = 128
	famClients = 16
	famLockers = 8
	famHold    = time.Millisecond
)

// famSide is one side: famClients clients of one key on famLockers
// Lockers, a semaphore of n (n > 1) or the mutex (n == 1).
type famSide struct {
	name     string
	n        int
	key      string
	ls       []locker.Locker
	counts   []int
	acquired int
	elapsed  time.Duration
	inside   atomic.Int32
	most     atomic.Int32
}

func newFamSide(b *testing.B, d dialect, name string, n int) *famSide {
	s := &famSide{name: name, n: n, key: fmt.Sprintf("bench/%s/%s/%d", b.Name(), name, time.Now().UnixNano()), counts: make([]int, famClients)}
	for range famLockers {
		l := locker.Locker(open(b, d.url(b, "", url.Values{"lock_max_conns": {"6"}})))
		if n > 1 {
			l = locker.Semaphore(l, n)
		}
		s.ls = append(s.ls, l)
	}
	return s
}

func (s *famSide) reset() {
	clear(s.counts)
	s.acquired, s.elapsed = 0, 0
	s.most.Store(0)
}

// phase runs the clients until quota acquisitions were made.
func (s *famSide) phase(b *testing.B, ctx context.Context, quota int) {
	var left atomic.Int64
	left.Store(int64(quota))
	var wg sync.WaitGroup
	start := time.Now()
	for c := range famClients {
		l := s.ls[c%len(s.ls)]
		wg.Go(func() {
			for left.Load() > 0 {
				h, err := l.Acquire(ctx, s.key)
				if err != nil {
					b.Errorf("%s: %v", s.name, err)
					return
				}
				in := s.inside.Add(1)
				for m := s.most.Load(); in > m && !s.most.CompareAndSwap(m, in); m = s.most.Load() {
				}
				if left.Add(-1) >= 0 {
					s.counts[c]++ // one goroutine per client
				}
				time.Sleep(famHold)
				s.inside.Add(-1)
				if err := h.Release(ctx); err != nil {
					b.Errorf("%s: release: %v", s.name, err)
					return
				}
			}
		})
	}
	wg.Wait()
	s.elapsed += time.Since(start)
	s.acquired += quota
}
