package postgres_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/internal/benchstats"
)

// BenchmarkSemaphore: 16 clients (on 8 Lockers, like 8 processes) contend
// for a semaphore of 4, each holding a permit for 1ms, beside the same
// clients on a mutex and on "slots", the semaphore a user would build from
// the mutex (4 keys: TryAcquire each in turn, and when all are held wait on
// one chosen at random), in interleaved phases of 128 acquisitions on the
// same server. b.N is the acquisitions of each side. Reported per side
// (suffix): acquisitions per second, share (the fewest acquisitions of a
// client over the most: 1 is fair), handoff p50/p99 (from a release to the
// next acquisition), and the semaphore's throughput over the others'.
//
//	cd integration && go test -run '^$' -bench '^BenchmarkSemaphore$' -benchtime 2048x ./postgres
func BenchmarkSemaphore(b *testing.B) {
	const (
		clients = 16
		lockers = 8
		n       = 4
		phase   = 128
	)
	dsn := testserver.Postgres(b).DSN()
	ls := make([]locker.Locker, lockers)
	for i := range ls {
		ls[i] = benchLocker(b, dsn, lockerConns)
	}
	key := func(side string) string { return fmt.Sprintf("bench/%s/%s/%d", b.Name(), side, time.Now().UnixNano()) }

	// The semaphore, with a check that it never has more than n holders.
	semKey := key("semaphore")
	var inside, most atomic.Int32
	sem := &benchstats.Contention{Hold: time.Millisecond}
	for i := range clients {
		s := locker.Semaphore(ls[i%lockers], n)
		sem.Takes = append(sem.Takes, func(ctx context.Context) (func(context.Context) error, error) {
			h, err := s.Acquire(ctx, semKey)
			if err != nil {
				return nil, err
			}
			in := inside.Add(1)
			for m := most.Load(); in > m && !most.CompareAndSwap(m, in); m = most.Load() {
			}
			return func(ctx context.Context) error { inside.Add(-1); return h.Release(ctx) }, nil
		})
	}
	mutexKey := key("mutex")
	mutex := &benchstats.Contention{Hold: time.Millisecond}
	for i := range clients {
		l := ls[i%lockers]
		mutex.Takes = append(mutex.Takes, func(ctx context.Context) (func(context.Context) error, error) {
			h, err := l.Acquire(ctx, mutexKey)
			if err != nil {
				return nil, err
			}
			return h.Release, nil
		})
	}
	slotKeys := make([]string, n)
	for i := range slotKeys {
		slotKeys[i] = key(fmt.Sprintf("slot%d", i))
	}
	slots := &benchstats.Contention{Hold: time.Millisecond}
	for i := range clients {
		l := ls[i%lockers]
		slots.Takes = append(slots.Takes, func(ctx context.Context) (func(context.Context) error, error) {
			for _, k := range slotKeys {
				if h, err := l.TryAcquire(ctx, k); err == nil {
					return h.Release, nil
				}
			}
			h, err := l.Acquire(ctx, slotKeys[rand.IntN(n)])
			if err != nil {
				return nil, err
			}
			return h.Release, nil
		})
	}

	sides := []*benchstats.Contention{sem, mutex, slots}
	names := []string{"-semaphore", "-mutex", "-slots"}
	ctx := context.Background()
	for _, c := range sides { // warm-up: connections, statement caches
		if err := c.Run(ctx, 2*clients); err != nil {
			b.Fatal(err)
		}
		c.Reset()
	}
	b.ResetTimer()
	for i, done := 0, 0; done < b.N; i, done = i+1, done+phase {
		runs := make([]func(), len(sides))
		for j, c := range sides {
			runs[j] = func() {
				if err := c.Run(ctx, int64(min(phase, b.N-done))); err != nil {
					b.Fatalf("%s: %v", names[j][1:], err)
				}
			}
		}
		benchstats.Rotated(i, runs...)
	}
	b.StopTimer()
	if m := most.Load(); m > n {
		b.Fatalf("a semaphore of %d had %d holders at once", n, m)
	}
	for j, c := range sides {
		c.Report(b, names[j])
	}
	b.ReportMetric(sem.Throughput()/mutex.Throughput(), "semaphore/mutex-acq/s")
	b.ReportMetric(sem.Throughput()/slots.Throughput(), "semaphore/slots-acq/s")
}
