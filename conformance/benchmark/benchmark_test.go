package benchmark_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/memlock"
)

// memlockSide is memlock, every contender on a Locker of its own on one
// Store (as if each were another process of one host).
func memlockSide() benchmark.Side {
	st := memlock.NewStore()
	return benchmark.LockerSide("locker", 0, func(testing.TB) locker.Locker { return st.NewLocker() })
}

// mutexSide is a sync.Mutex per key, the floor of an in-process lock.
func mutexSide() benchmark.Side {
	var mus sync.Map
	return benchmark.Side{Name: "mutex", New: func(_ testing.TB, key string, _ int) benchmark.Lock {
		m, _ := mus.LoadOrStore(key, new(sync.Mutex))
		mu := m.(*sync.Mutex)
		return func(context.Context) (func(context.Context) error, error) {
			mu.Lock()
			return func(context.Context) error { mu.Unlock(); return nil }, nil
		}
	}}
}

// BenchmarkLock is the kit on memlock, beside a sync.Mutex.
func BenchmarkLock(b *testing.B) {
	benchmark.Run(b, benchmark.Harness{Sides: []benchmark.Side{memlockSide(), mutexSide()}})
}

// BenchmarkInstructions counts the instructions of memlock's cycle and a
// sync.Mutex's (valgrind's callgrind; skipped without it).
func BenchmarkInstructions(b *testing.B) {
	benchmark.RunInstructions(b, benchmark.Instructions{Sides: []benchmark.Side{memlockSide(), mutexSide()}, Runs: 2})
}

// TestGroup: a Handoff phase counts exactly the handoffs asked for, every
// one to another contender (two contenders alternate); a Contended
// phase the acquisitions asked for; a phase bounded by its context ends
// with it; never two holders at once.
func TestGroup(t *testing.T) {
	ctx := context.Background()
	st := memlock.NewStore()
	locks := func(n int) []benchmark.Lock {
		ls := make([]benchmark.Lock, n)
		key := t.Name() + "/" + time.Now().String()
		for i := range ls {
			l := st.NewLocker()
			t.Cleanup(func() { l.Close() })
			ls[i] = benchmark.LockOf(l, key)
		}
		return ls
	}
	var counted atomic.Int64
	g := benchmark.NewGroup(benchmark.Handoff, locks(2))
	g.OnCount = func() { counted.Add(1) }
	g.Stall = 10 * time.Second
	defer g.Stop()
	for range 2 {
		if err := g.Phase(ctx, 30); err != nil {
			t.Fatal(err)
		}
	}
	if g.Acquired != 60 || len(g.Handoffs) != 60 || counted.Load() != 60 {
		t.Fatalf("handoff: %d acquired, %d handoffs, %d counted; want 60", g.Acquired, len(g.Handoffs), counted.Load())
	}
	for i, n := range g.Counts {
		if n != 30 {
			t.Errorf("handoff: contender %d had %d turns, want 30 (they alternate): %v", i, n, g.Counts)
		}
	}

	c := benchmark.NewGroup(benchmark.Contended, locks(4))
	c.Hold = 10 * time.Microsecond
	defer c.Stop()
	if err := c.Phase(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if c.Acquired != 100 || len(c.Waits) != 100 || len(c.Handoffs) != 99 {
		t.Fatalf("contended: %d acquired, %d waits, %d handoffs; want 100, 100, 99", c.Acquired, len(c.Waits), len(c.Handoffs))
	}
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := c.Phase(tctx, 0); err != nil {
		t.Fatal(err)
	}
	if c.Acquired <= 100 {
		t.Fatalf("a phase of 50ms counted nothing")
	}
}

// TestGroupErrors: a Lock's error ends the phase with it, the other
// contenders' waits included; a phase in which nobody gets the lock fails
// after Stall.
func TestGroupErrors(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")
	var calls atomic.Int64
	block := func(ctx context.Context) (func(context.Context) error, error) {
		<-ctx.Done() // waits until the phase ends
		return nil, context.Cause(ctx)
	}
	failing := func(context.Context) (func(context.Context) error, error) {
		calls.Add(1)
		return nil, boom
	}
	g := benchmark.NewGroup(benchmark.Contended, []benchmark.Lock{block, failing})
	defer g.Stop()
	if err := g.Phase(ctx, 10); !errors.Is(err, boom) {
		t.Fatalf("Phase with a failing Lock: %v, want %v", err, boom)
	}
	s := benchmark.NewGroup(benchmark.Handoff, []benchmark.Lock{block, block})
	s.Stall = 50 * time.Millisecond
	defer s.Stop()
	if err := s.Phase(ctx, 10); err == nil || !strings.Contains(err.Error(), "no contender took the lock") {
		t.Fatalf("Phase where nobody takes the lock: %v, want a stall", err)
	}
}

// BenchmarkScale is the Scale case on memlock, beside a sync.Mutex per
// key.
func BenchmarkScale(b *testing.B) {
	st := memlock.NewStore()
	mutex := mutexSide()
	benchmark.RunScale(b, benchmark.Scale{Keys: 100, Clients: 8, PerClient: 2, Hold: 10 * time.Microsecond, Sides: []benchmark.ScaleSide{
		{Name: "locker", Client: benchmark.LockerClient(func(testing.TB) locker.Locker { return st.NewLocker() })},
		{Name: "mutex", Client: func(tb testing.TB, i int) benchmark.Client {
			return func(key string) benchmark.Lock { return mutex.New(tb, key, i) }
		}},
	}})
}
