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
	"github.com/go-locker/locker/zookeeper"
)

// Benchmarks talk to the server directly (no proxy). Run with
//
//	go test -run '^$' -bench . -benchtime 2s ./zookeeper/
//
// and compare: our Acquire+Release, go-zookeeper's zk.Lock, and the raw
// floor (create of an ephemeral sequential node, then its delete).

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

func BenchmarkUncontended(b *testing.B) {
	srv := testserver.ZooKeeper(b)
	ctx := context.Background()
	b.Run("locker", func(b *testing.B) {
		l := benchLocker(b, srv.Addr())
		k := benchKey("uncontended")
		for b.Loop() {
			h, err := l.Acquire(ctx, k)
			if err != nil {
				b.Fatal(err)
			}
			if err := h.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("zk.Lock", func(b *testing.B) {
		c := benchConn(b, srv.Addr())
		lk := zk.NewLock(c, zookeeper.LockDir("/locker-zklock", benchKey("uncontended")), zk.WorldACL(zk.PermAll))
		for b.Loop() {
			if err := lk.Lock(); err != nil {
				b.Fatal(err)
			}
			if err := lk.Unlock(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("raw-create-delete", func(b *testing.B) {
		c := benchConn(b, srv.Addr())
		l := benchLocker(b, srv.Addr())
		k := benchKey("raw")
		h, err := l.Acquire(ctx, k) // makes the directory
		if err != nil {
			b.Fatal(err)
		}
		_ = h.Release(ctx)
		dir := zookeeper.LockDir("", k)
		for b.Loop() {
			p, err := c.Create(dir+"/n-", nil, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
			if err != nil {
				b.Fatal(err)
			}
			if err := c.Delete(p, -1); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// handoff runs waiters goroutines, each on its own connection, taking the
// lock in turn; it reports the time from a Release call to the next holder's
// Acquire returning (p50, p99), and each client's share of acquisitions.
func handoff(b *testing.B, waiters int, acquire []func() (release func())) {
	var (
		lastRelease atomic.Int64
		mu          sync.Mutex
		lat         []time.Duration
		counts      = make([]int64, waiters)
		left        atomic.Int64
		wg          sync.WaitGroup
	)
	left.Store(int64(b.N))
	b.ResetTimer()
	start := time.Now()
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				release := acquire[i]()
				now := time.Now()
				if r := lastRelease.Load(); r != 0 {
					mu.Lock()
					lat = append(lat, now.Sub(time.Unix(0, r)))
					mu.Unlock()
				}
				counts[i]++
				lastRelease.Store(time.Now().UnixNano())
				release()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "acq/s")
	if waiters > 1 && b.N >= 10*waiters {
		lo, hi := slices.Min(counts), slices.Max(counts)
		b.ReportMetric(float64(lo)/float64(hi), "min/max-share")
	}
}

func BenchmarkHandoff(b *testing.B) {
	srv := testserver.ZooKeeper(b)
	ctx := context.Background()
	for _, n := range []int{2, 9, 65} { // one holder and 1, 8 or 64 waiters
		b.Run(fmt.Sprintf("locker/waiters=%d", n-1), func(b *testing.B) {
			k := benchKey("handoff")
			acq := make([]func() func(), n)
			for i := range acq {
				l := benchLocker(b, srv.Addr())
				acq[i] = func() func() {
					h, err := l.Acquire(ctx, k)
					if err != nil {
						b.Error(err)
						return func() {}
					}
					return func() { _ = h.Release(ctx) }
				}
			}
			handoff(b, n, acq)
		})
		b.Run(fmt.Sprintf("zk.Lock/waiters=%d", n-1), func(b *testing.B) {
			dir := zookeeper.LockDir("/locker-zklock", benchKey("handoff"))
			acq := make([]func() func(), n)
			for i := range acq {
				lk := zk.NewLock(benchConn(b, srv.Addr()), dir, zk.WorldACL(zk.PermAll))
				acq[i] = func() func() {
					if err := lk.Lock(); err != nil {
						b.Error(err)
						return func() {}
					}
					return func() { _ = lk.Unlock() }
				}
			}
			handoff(b, n, acq)
		})
	}
}

var _ locker.Locker = (*zookeeper.Locker)(nil)
