// Package benchmark is the one set of lock benchmarks every backend runs,
// beside the competitors it is measured against: the library a Go user
// would otherwise pick and the raw client calls a lock needs at the least.
// A backend's benchmark file supplies only its sides and calls Run, the way
// Go CDK's drivertest.RunBenchmarks works:
//
//	func BenchmarkLock(b *testing.B) {
//		benchmark.Run(b, benchmark.Harness{Sides: []benchmark.Side{
//			benchmark.LockerSide("locker", 0, func(tb testing.TB) locker.Locker { return mybackend.New(...) }),
//			{Name: "raw", New: rawLock},
//		}})
//	}
//
// which gives, for every backend, the sub-benchmarks
//
//	BenchmarkLock/Uncontended
//	BenchmarkLock/Handoff/waiters=1, =8, =64
//	BenchmarkLock/Contended/clients=8
//
// The sides are interleaved: in Uncontended one cycle of each side in turn
// per iteration, in Handoff and Contended one phase of each side in turn
// (the others' contenders parked meanwhile), which side goes first
// rotating, so that all see the same machine load; the figures to read are
// the ratios of the first side (the Locker) to each other side, measured
// in the same process, not the absolute times.
//
// The same cases, with a Group, are what `locker bench` runs against any
// backend URL.
package benchmark

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/benchstats"
)

// Side is one implementation measured.
type Side struct {
	Name string
	// New returns the Lock of key of contender i of a case, on clients of
	// its own where the side stands for separate processes. It is called
	// once for each contender; what it opens it closes with tb.Cleanup.
	New func(tb testing.TB, key string, i int) Lock
	// Floor marks a side whose Lock cannot wait (it fails on a held key,
	// such as a bare SET NX): it runs in Uncontended only.
	Floor bool
	// Requests, if set, is the count of requests the side's clients have
	// sent so far; each case reports the requests per acquisition.
	Requests func() int64
	// Limit is how many may hold at once: a semaphore's n (run it in
	// Contended only: Handoff's turns are a lock's); 0 or 1, a lock.
	Limit int
}

// Harness is what Run needs: the sides and the shape of the cases.
type Harness struct {
	// Sides: the first is the one under test (the Locker); every ratio is
	// of it over another.
	Sides []Side
	// Hold is how long a holder keeps the lock in Handoff (once the others
	// are waiting) and Contended; default 1ms.
	Hold time.Duration
	// Waiters are the waiter counts of the Handoff cases; default 1, 8, 64.
	Waiters []int
	// Clients is the contender count of the Contended case; default 8.
	Clients int
	// Phase is how many handoffs or acquisitions one side counts before
	// the next side takes its turn; default 128 (a multiple of 8 and 64,
	// so that a fair lock gives each contender the same share of a phase).
	Phase int
	// Stall fails a case in which no contender takes the lock for that
	// long; default one minute.
	Stall time.Duration
}

func (h *Harness) defaults() {
	if h.Hold == 0 {
		h.Hold = time.Millisecond
	}
	if h.Waiters == nil {
		h.Waiters = []int{1, 8, 64}
	}
	if h.Clients == 0 {
		h.Clients = 8
	}
	if h.Phase <= 0 {
		h.Phase = 128
	}
	if h.Stall <= 0 {
		h.Stall = time.Minute
	}
}

// Run runs the cases Uncontended, Handoff/waiters=W and
// Contended/clients=N as sub-benchmarks of b. In Uncontended, b.N is
// iterations of one Lock+release cycle of each side, ns/op their sum; in
// the others b.N is the handoffs or acquisitions each side counts, ns/op
// the wall time of all sides' phases per count.
func Run(b *testing.B, h Harness) {
	h.defaults()
	if len(h.Sides) == 0 {
		b.Fatal("benchmark.Run: no sides")
	}
	b.Run("Uncontended", func(b *testing.B) { uncontended(b, h) })
	for _, w := range h.Waiters {
		b.Run(fmt.Sprintf("Handoff/waiters=%d", w), func(b *testing.B) { contended(b, h, Handoff, w+1) })
	}
	if h.Clients > 1 {
		b.Run(fmt.Sprintf("Contended/clients=%d", h.Clients), func(b *testing.B) { contended(b, h, Contended, h.Clients) })
	}
}

// Key returns a key of its own for a case of b and a side.
func Key(b testing.TB, side string) string {
	return fmt.Sprintf("bench/%s/%s/%d", b.Name(), side, time.Now().UnixNano())
}

func uncontended(b *testing.B, h Harness) {
	ctx := context.Background()
	sides := h.Sides
	times := make([][]time.Duration, len(sides))
	runs := make([]func(), len(sides))
	for i, s := range sides {
		lock := s.New(b, Key(b, s.Name), 0)
		for range 3 { // connections, schemas, statement caches
			if _, err := Cycle(ctx, lock, time.Minute); err != nil {
				b.Fatalf("%s: warm-up: %v", s.Name, err)
			}
		}
		times[i] = make([]time.Duration, 0, b.N)
		runs[i] = func() {
			d, err := Cycle(ctx, lock, time.Minute)
			if err != nil {
				b.Fatalf("%s: %v", s.Name, err)
			}
			times[i] = append(times[i], d)
		}
	}
	reqs := requests(sides)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		benchstats.Rotated(i, runs...)
	}
	b.StopTimer()
	p50 := make([]time.Duration, len(sides))
	for i, s := range sides {
		slices.Sort(times[i])
		p50[i] = benchstats.Percentile(times[i], 0.5)
		b.ReportMetric(benchstats.Micros(p50[i]), s.Name+"-p50-µs")
		b.ReportMetric(benchstats.Micros(benchstats.Percentile(times[i], 0.99)), s.Name+"-p99-µs")
		reportRequests(b, s, reqs[i], b.N)
	}
	for i, s := range sides[1:] {
		b.ReportMetric(float64(p50[0])/float64(p50[i+1]), sides[0].Name+"/"+s.Name)
	}
}

// contended runs the Handoff or the Contended case with n contenders per
// side.
func contended(b *testing.B, h Harness, mode Mode, n int) {
	ctx := context.Background()
	var sides []Side
	for _, s := range h.Sides {
		if !s.Floor {
			sides = append(sides, s)
		}
	}
	groups := make([]*Group, len(sides))
	for i, s := range sides {
		key := Key(b, s.Name)
		locks := make([]Lock, n)
		for j := range locks {
			locks[j] = s.New(b, key, j)
		}
		g := NewGroup(mode, locks)
		g.Hold, g.Stall, g.Limit = h.Hold, h.Stall, s.Limit
		groups[i] = g
		b.Cleanup(g.Stop)
		// Warm up: every contender takes the lock a few times (its
		// connections, its subscriptions); then forget it.
		if err := g.Phase(ctx, 2*n); err != nil {
			b.Fatalf("%s: warm-up: %v", s.Name, err)
		}
		g.reset()
	}
	reqs := requests(sides)
	b.ResetTimer()
	for i, done := 0, 0; done < b.N; i, done = i+1, done+h.Phase {
		phases := make([]func(), len(groups))
		for j, g := range groups {
			phases[j] = func() {
				if err := g.Phase(ctx, min(h.Phase, b.N-done)); err != nil {
					b.Fatalf("%s: %v", sides[j].Name, err)
				}
			}
		}
		benchstats.Rotated(i, phases...)
	}
	b.StopTimer()
	p50 := make([]time.Duration, len(sides))
	tput := make([]float64, len(sides))
	for i, s := range sides {
		g := groups[i]
		slices.Sort(g.Handoffs)
		p50[i] = benchstats.Percentile(g.Handoffs, 0.5)
		p99 := benchstats.Percentile(g.Handoffs, 0.99)
		tput[i] = float64(g.Acquired) / g.Elapsed.Seconds()
		prefix := s.Name + "-"
		if mode == Contended {
			prefix += "handoff-"
		}
		b.ReportMetric(benchstats.Micros(p50[i]), prefix+"p50-µs")
		b.ReportMetric(benchstats.Micros(p99), prefix+"p99-µs")
		b.ReportMetric(tput[i], s.Name+"-acq/s")
		b.ReportMetric(g.Share(), s.Name+"-share")
		reportRequests(b, s, reqs[i], g.Acquired)
	}
	for i, s := range sides[1:] {
		if mode == Contended {
			b.ReportMetric(tput[0]/tput[i+1], sides[0].Name+"/"+s.Name+"-acq/s")
		} else {
			b.ReportMetric(float64(p50[0])/float64(p50[i+1]), sides[0].Name+"/"+s.Name)
		}
	}
}

// reset forgets the totals, such as those of a warm-up.
func (g *Group) reset() {
	clear(g.Counts)
	g.Handoffs, g.Waits, g.Acquired, g.Elapsed = nil, nil, 0, 0
}

// Share is the fewest counted acquisitions of a contender over the most:
// 1 is perfectly fair, 0 means one got none.
func (g *Group) Share() float64 {
	if len(g.Counts) == 0 {
		return 0
	}
	return float64(slices.Min(g.Counts)) / float64(max(slices.Max(g.Counts), 1))
}

func requests(sides []Side) []int64 {
	r := make([]int64, len(sides))
	for i, s := range sides {
		if s.Requests != nil {
			r[i] = s.Requests()
		}
	}
	return r
}

func reportRequests(b *testing.B, s Side, before int64, acquisitions int) {
	if s.Requests != nil && acquisitions > 0 {
		b.ReportMetric(float64(s.Requests()-before)/float64(acquisitions), s.Name+"-reqs/acq")
	}
}

// LockerSide is the side of Lockers made by open: with lockers ≤ 0 a
// Locker for each contender (like separate processes), else contender i
// on Locker i mod lockers (opened for each case, closed at its end).
// opts are passed to every Acquire.
func LockerSide(name string, lockers int, open func(tb testing.TB) locker.Locker, opts ...locker.Option) Side {
	var (
		mu    sync.Mutex
		byKey = map[string][]locker.Locker{} // by key: one case's Lockers
	)
	return Side{Name: name, New: func(tb testing.TB, key string, i int) Lock {
		mu.Lock()
		defer mu.Unlock()
		ls := byKey[key]
		if lockers <= 0 || len(ls) < lockers {
			l := open(tb)
			tb.Cleanup(func() { _ = l.Close() })
			ls = append(ls, l)
			byKey[key] = ls
			if len(ls) == 1 {
				tb.Cleanup(func() { mu.Lock(); delete(byKey, key); mu.Unlock() })
			}
			return LockOf(l, key, opts...)
		}
		return LockOf(ls[i%len(ls)], key, opts...)
	}}
}
