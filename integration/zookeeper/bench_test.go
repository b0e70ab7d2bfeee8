package zookeeper_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/internal/benchstats"
	"github.com/go-locker/locker/zookeeper"
)

// Benchmarks talk to the server directly (no proxy). They compare our
// Acquire+Release with go-zookeeper's zk.Lock and with the raw floor (the
// create of an ephemeral sequential node, then its delete), interleaved in
// one run so that all sides see the same machine load (ZooKeeper fsyncs
// its transaction log, so every write costs a disk flush, and the disk is
// shared with whatever else runs). Run with
//
//	go test -run '^$' -bench 'UncontendedInterleaved|HandoffInterleaved|ContendedInterleaved' -benchtime 400x ./zookeeper

func benchConn(b *testing.B, addr string) *zk.Conn {
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

func benchLocker(b *testing.B, addr string) *zookeeper.Locker {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := zookeeper.Connect(ctx, []string{addr}, zookeeper.WithSessionTimeout(sessionTimeout))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	return l
}

func benchKey(name string) string { return fmt.Sprintf("bench/%s/%d", name, time.Now().UnixNano()) }

// cycle is one acquisition and release by one implementation.
type cycle struct {
	name string
	run  func() error
}

// uncontendedCycles returns an Acquire+Release cycle for each of locker,
// zk.Lock and the raw floor, each on its own connection and key.
func uncontendedCycles(b *testing.B, addr string) []cycle {
	ctx := context.Background()
	l := benchLocker(b, addr)
	k := benchKey("uncontended")
	lk := zk.NewLock(benchConn(b, addr), zookeeper.LockDir("/locker-zklock", benchKey("uncontended")), zk.WorldACL(zk.PermAll))
	c := benchConn(b, addr)
	rawKey := benchKey("raw")
	h, err := l.Acquire(ctx, rawKey) // makes the directory
	if err != nil {
		b.Fatal(err)
	}
	_ = h.Release(ctx)
	dir := zookeeper.LockDir("", rawKey)
	// A GUID-protected name, like the other two create.
	prefix := dir + "/_c_0123456789abcdef0123456789abcdef-lock-"
	return []cycle{
		{"locker", func() error {
			h, err := l.Acquire(ctx, k)
			if err != nil {
				return err
			}
			return h.Release(ctx)
		}},
		{"zk.Lock", func() error {
			if err := lk.Lock(); err != nil {
				return err
			}
			return lk.Unlock()
		}},
		{"raw", func() error {
			p, err := c.Create(prefix, nil, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
			if err != nil {
				return err
			}
			return c.Delete(p, -1)
		}},
	}
}

// BenchmarkUncontended runs each side on its own, for -benchmem's
// allocation counts. Compare speed with BenchmarkUncontendedInterleaved.
func BenchmarkUncontended(b *testing.B) {
	addr := testserver.ZooKeeper(b).Addr()
	for i, name := range []string{"locker", "zk.Lock", "raw"} {
		b.Run("impl="+name, func(b *testing.B) {
			run := uncontendedCycles(b, addr)[i].run
			b.ReportAllocs()
			for b.Loop() {
				if err := run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkUncontendedInterleaved does one cycle of each side in turn
// (locker, zk.Lock, raw; the order rotates every iteration), so that all
// three see the same load. ns/op is the three cycles together; reported
// are each side's p50 and p99 and the ratios of locker's and zk.Lock's p50
// to the raw floor's.
func BenchmarkUncontendedInterleaved(b *testing.B) {
	cycles := uncontendedCycles(b, testserver.ZooKeeper(b).Addr())
	samples := make([][]time.Duration, len(cycles))
	for i := range samples {
		samples[i] = make([]time.Duration, 0, b.N)
	}
	n := 0
	for b.Loop() {
		for j := range cycles {
			i := (n + j) % len(cycles)
			start := time.Now()
			if err := cycles[i].run(); err != nil {
				b.Fatalf("%s: %v", cycles[i].name, err)
			}
			samples[i] = append(samples[i], time.Since(start))
		}
		n++
	}
	b.StopTimer()
	p50 := make([]time.Duration, len(cycles))
	for i, s := range samples {
		slices.Sort(s)
		p50[i] = benchstats.Percentile(s, 0.5)
		b.ReportMetric(benchstats.Micros(p50[i]), cycles[i].name+"-p50-µs")
		b.ReportMetric(benchstats.Micros(benchstats.Percentile(s, 0.99)), cycles[i].name+"-p99-µs")
	}
	b.ReportMetric(float64(p50[0])/float64(p50[2]), "locker/raw")
	b.ReportMetric(float64(p50[1])/float64(p50[2]), "zk.Lock/raw")
}

// contender is one client of a contended benchmark: acquire blocks until it
// holds the key and returns the release.
type contender func() (release func() error, err error)

// contenders makes n clients of impl ("locker" or "zk.Lock") on one key,
// each on its own connection, like separate processes.
func contenders(b *testing.B, addr, impl string, n int) []contender {
	ctx := context.Background()
	cs := make([]contender, n)
	switch impl {
	case "locker":
		k := benchKey("contended")
		for i := range cs {
			l := benchLocker(b, addr)
			cs[i] = func() (func() error, error) {
				h, err := l.Acquire(ctx, k)
				if err != nil {
					return nil, err
				}
				return func() error { return h.Release(ctx) }, nil
			}
		}
	case "zk.Lock":
		dir := zookeeper.LockDir("/locker-zklock", benchKey("contended"))
		for i := range cs {
			lk := zk.NewLock(benchConn(b, addr), dir, zk.WorldACL(zk.PermAll))
			cs[i] = func() (func() error, error) {
				if err := lk.Lock(); err != nil {
					return nil, err
				}
				return lk.Unlock, nil
			}
		}
	}
	return cs
}

// contendedStats is what a contended run measured.
type contendedStats struct {
	handoffs []time.Duration // from the start of a Release to the next holder holding
	counts   []int64         // acquisitions per client
	acqs     int64
	elapsed  time.Duration
}

// handoffHold is how long each holder keeps the lock in
// BenchmarkHandoffInterleaved: long enough for the previous holder to be
// queued again (its create written to disk) before the release, so that
// the handoff time is the release and the wake-up, not a queue of writes.
const handoffHold = 5 * time.Millisecond

// contend lets the clients take the key in turn, each holding it for hold,
// until acqs acquisitions were made in all, and adds to st. Every client
// stops after its first acquisition past the quota, so that no zk.Lock is
// left waiting (it takes no context).
func contend(b *testing.B, cs []contender, acqs int, hold time.Duration, st *contendedStats) {
	var (
		lastRelease atomic.Int64 // unix ns of the start of the last release; 0: none yet in this run
		mu          sync.Mutex
		left        atomic.Int64
		wg          sync.WaitGroup
	)
	left.Store(int64(acqs))
	if st.counts == nil {
		st.counts = make([]int64, len(cs))
	}
	start := time.Now()
	for i, acquire := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				release, err := acquire()
				if err != nil {
					b.Error(err)
					return
				}
				counted := left.Add(-1) >= 0
				if counted {
					now := time.Now()
					if r := lastRelease.Load(); r != 0 {
						mu.Lock()
						st.handoffs = append(st.handoffs, now.Sub(time.Unix(0, r)))
						mu.Unlock()
					}
					atomic.AddInt64(&st.counts[i], 1)
					if hold > 0 {
						time.Sleep(hold)
					}
					lastRelease.Store(time.Now().UnixNano())
				}
				if err := release(); err != nil {
					b.Error(err)
					return
				}
				if !counted {
					return
				}
			}
		}()
	}
	wg.Wait()
	st.elapsed += time.Since(start)
	st.acqs += int64(acqs)
}

// interleavedContention runs locker and zk.Lock with n clients each, in
// turns of a tenth of b.N acquisitions (which goes first alternating), and
// returns their stats.
func interleavedContention(b *testing.B, n int, hold time.Duration) map[string]*contendedStats {
	addr := testserver.ZooKeeper(b).Addr()
	impls := []string{"locker", "zk.Lock"}
	cs := map[string][]contender{}
	st := map[string]*contendedStats{}
	for _, impl := range impls {
		cs[impl] = contenders(b, addr, impl, n)
		st[impl] = &contendedStats{}
	}
	b.ResetTimer()
	turn := max(b.N/10, 1)
	for i, done := 0, 0; done < b.N; i, done = i+1, done+turn {
		// Which side goes first alternates: a phase that starts on the
		// heels of the other side's may inherit its server work.
		for j := range impls {
			impl := impls[(i+j)%len(impls)]
			contend(b, cs[impl], min(turn, b.N-done), hold, st[impl])
		}
	}
	b.StopTimer()
	return st
}

// BenchmarkHandoffInterleaved: one holder and 1, 8 or 64 waiters, each on
// its own connection, take one key in turn, each holding it handoffHold;
// locker and zk.Lock alternate every tenth of the run. Reported per side:
// the handoff time (from the start of a Release to the next holder's
// Acquire returning) p50 and p99, and acquisitions per second. ns/op is
// one acquisition of each side.
func BenchmarkHandoffInterleaved(b *testing.B) {
	for _, waiters := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("waiters=%d", waiters), func(b *testing.B) {
			st := interleavedContention(b, waiters+1, handoffHold)
			for _, impl := range []string{"locker", "zk.Lock"} {
				s := st[impl]
				slices.Sort(s.handoffs)
				b.ReportMetric(benchstats.Micros(benchstats.Percentile(s.handoffs, 0.5)), impl+"-p50-µs")
				b.ReportMetric(benchstats.Micros(benchstats.Percentile(s.handoffs, 0.99)), impl+"-p99-µs")
				b.ReportMetric(float64(s.acqs)/s.elapsed.Seconds(), impl+"-acq/s")
			}
		})
	}
}

// BenchmarkContendedInterleaved: 8 clients, each on its own connection,
// take one key as fast as they can; locker and zk.Lock alternate every
// tenth of the run. Reported per side: acquisitions per second and
// fairness, the fewest acquisitions any client made over the most (1 is
// perfectly fair; it needs many acquisitions per client to mean anything:
// run with -benchtime 800x or more).
func BenchmarkContendedInterleaved(b *testing.B) {
	const clients = 8
	st := interleavedContention(b, clients, 0)
	for _, impl := range []string{"locker", "zk.Lock"} {
		s := st[impl]
		b.ReportMetric(float64(s.acqs)/s.elapsed.Seconds(), impl+"-acq/s")
		b.ReportMetric(float64(slices.Min(s.counts))/float64(slices.Max(s.counts)), impl+"-min/max-share")
	}
}

var _ locker.Locker = (*zookeeper.Locker)(nil)
