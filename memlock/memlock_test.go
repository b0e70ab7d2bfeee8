package memlock

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/benchstats"
)

// TestMain fails the package if any test leaves a goroutine running: every
// Locker's watchdog must be gone once it is closed or crashed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// bound is how long a test waits for something that should happen at once.
// It only separates "happens" from "hangs".
const bound = 5 * time.Second

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newLocker returns a Locker on s that is closed when the test ends.
func newLocker(t *testing.T, s *Store, opts ...Option) *Locker {
	l := s.NewLocker(opts...)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func mustAcquire(t *testing.T, l *Locker, key string, opts ...locker.Option) locker.Handle {
	t.Helper()
	h, err := l.Acquire(testCtx(t), key, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", key, err)
	}
	return h
}

type result struct {
	h   locker.Handle
	err error
}

// goAcquire starts Acquire in a goroutine.
func goAcquire(ctx context.Context, l *Locker, key string, opts ...locker.Option) <-chan result {
	ch := make(chan result, 1)
	go func() {
		h, err := l.Acquire(ctx, key, opts...)
		ch <- result{h, err}
	}()
	return ch
}

func await(t *testing.T, ch <-chan result, what string) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(bound):
		t.Fatalf("%s: no result within %v", what, bound)
		return result{}
	}
}

// queued is how many callers wait for key in s.
func (s *Store) queued(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.keys[key]; e != nil {
		return e.waiters.Len()
	}
	return 0
}

// entries is how many keys s has state for.
func (s *Store) entries() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

// waitQueued waits until n callers are queued on key: the condition that a
// goroutine started with goAcquire has reached the store. It yields rather
// than sleeps, and gives up after bound.
func waitQueued(t *testing.T, s *Store, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for s.queued(key) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiter(s) on %q, want %d", s.queued(key), key, n)
		}
		runtime.Gosched()
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestTokensComeFromOneCounterPerStore(t *testing.T) {
	s := NewStore()
	l := newLocker(t, s)
	var got []int64
	for _, key := range []string{"a", "b", "a", "a"} {
		h := mustAcquire(t, l, key)
		got = append(got, h.Token())
		if err := h.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if want := []int64{1, 2, 3, 4}; !slices.Equal(got, want) {
		t.Fatalf("tokens %v, want %v", got, want)
	}
	if n := s.entries(); n != 0 {
		t.Fatalf("store keeps %d entries after every key was released, want 0", n)
	}
}

func TestTTLValidation(t *testing.T) {
	tests := []struct {
		name     string
		lockerOp []Option
		callOpt  []locker.Option
		wantTTL  time.Duration // when the call succeeds
		wantErr  error
	}{
		{"Default", nil, nil, locker.DefaultTTL, nil},
		{"PerCall", nil, []locker.Option{locker.WithTTL(time.Second)}, time.Second, nil},
		{"AtMinimum", nil, []locker.Option{locker.WithTTL(locker.MinTTL)}, locker.MinTTL, nil},
		{"AtMaximum", nil, []locker.Option{locker.WithTTL(locker.MaxTTL)}, locker.MaxTTL, nil},
		{"AboveMaximum", nil, []locker.Option{locker.WithTTL(locker.MaxTTL + 1)}, 0, locker.ErrInvalidOption},
		{"LockerDefaultAboveMaximum", []Option{WithDefaultTTL(locker.MaxTTL + 1)}, nil, 0, locker.ErrInvalidOption},
		{"LockerDefault", []Option{WithDefaultTTL(time.Minute)}, nil, time.Minute, nil},
		{"PerCallBeatsLockerDefault", []Option{WithDefaultTTL(time.Minute)}, []locker.Option{locker.WithTTL(time.Second)}, time.Second, nil},
		{"NilOptions", []Option{nil}, []locker.Option{nil}, locker.DefaultTTL, nil},
		{"Zero", nil, []locker.Option{locker.WithTTL(0)}, 0, locker.ErrInvalidOption},
		{"Negative", nil, []locker.Option{locker.WithTTL(-time.Second)}, 0, locker.ErrInvalidOption},
		{"BelowMinimum", nil, []locker.Option{locker.WithTTL(locker.MinTTL - 1)}, 0, locker.ErrInvalidOption},
		{"LockerDefaultBelowMinimum", []Option{WithDefaultTTL(time.Microsecond)}, nil, 0, locker.ErrInvalidOption},
		{"LockerDefaultZero", []Option{WithDefaultTTL(0)}, []locker.Option{locker.WithTTL(time.Second)}, 0, locker.ErrInvalidOption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewStore()
			l := newLocker(t, s, tt.lockerOp...)
			for _, try := range []bool{false, true} {
				var h locker.Handle
				var err error
				if try {
					h, err = l.TryAcquire(t.Context(), "k", tt.callOpt...)
				} else {
					h, err = l.Acquire(t.Context(), "k", tt.callOpt...)
				}
				if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
					t.Fatalf("try=%v: err = %v, want %v", try, err, tt.wantErr)
				}
				if err != nil {
					if s.entries() != 0 {
						t.Fatal("a rejected call left state in the store")
					}
					continue
				}
				if got := h.TTL(); got != tt.wantTTL {
					t.Errorf("try=%v: lease %v, want %v", try, got, tt.wantTTL)
				}
				if err := h.Release(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestInvalidKeyNamesOpAndKey(t *testing.T) {
	l := newLocker(t, NewStore())
	_, err := l.TryAcquire(t.Context(), "a\x00b")
	var e *locker.Error
	if !errors.As(err, &e) || e.Op != "try-acquire" || e.Key != "a\x00b" || !errors.Is(err, locker.ErrInvalidKey) {
		t.Fatalf("err = %#v, want *locker.Error{Op: try-acquire, Key: a\\x00b} wrapping ErrInvalidKey", err)
	}
}

// TestWaitersAreServedInOrder checks FIFO handoff across Lockers.
func TestWaitersAreServedInOrder(t *testing.T) {
	s := NewStore()
	holder := newLocker(t, s)
	h := mustAcquire(t, holder, "k")

	const n = 5
	results := make([]<-chan result, n)
	for i := range n {
		results[i] = goAcquire(testCtx(t), newLocker(t, s), "k")
		waitQueued(t, s, "k", i+1)
	}
	last := h.Token()
	if err := h.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		r := await(t, results[i], fmt.Sprintf("waiter %d", i))
		if r.err != nil {
			t.Fatalf("waiter %d: %v", i, r.err)
		}
		if r.h.Token() <= last {
			t.Fatalf("waiter %d: token %d after %d", i, r.h.Token(), last)
		}
		last = r.h.Token()
		for j := i + 1; j < n; j++ {
			select {
			case <-results[j]:
				t.Fatalf("waiter %d got the key before waiter %d released it", j, i)
			default:
			}
		}
		if err := r.h.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if s.entries() != 0 {
		t.Fatal("store keeps state after the last release")
	}
}

func TestNotReentrant(t *testing.T) {
	s := NewStore()
	l := newLocker(t, s)
	h := mustAcquire(t, l, "k")
	if _, err := l.TryAcquire(t.Context(), "k"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a key the same Locker holds: %v, want ErrNotAcquired", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ch := goAcquire(ctx, l, "k")
	waitQueued(t, s, "k", 1)
	cancel()
	if r := await(t, ch, "second Acquire"); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("second Acquire: %v, want context.Canceled", r.err)
	}
	if err := h.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// deadlineCtx is a context whose deadline passes when the test closes
// passed, so that a wait can be seen queued before it ends. (The suite in
// package conformance checks real timer deadlines.)
type deadlineCtx struct {
	context.Context
	passed chan struct{}
}

func (c *deadlineCtx) Done() <-chan struct{} { return c.passed }

func (c *deadlineCtx) Err() error {
	select {
	case <-c.passed:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// TestAbandonedWaitLeavesNothing cancels waits in every way a context ends.
func TestAbandonedWaitLeavesNothing(t *testing.T) {
	tests := []struct {
		name string
		ctx  func(context.Context) (context.Context, func())
		want error
	}{
		{"Cancel", func(p context.Context) (context.Context, func()) {
			ctx, cancel := context.WithCancel(p)
			return ctx, cancel
		}, context.Canceled},
		{"Deadline", func(p context.Context) (context.Context, func()) {
			ctx := &deadlineCtx{Context: p, passed: make(chan struct{})}
			return ctx, func() { close(ctx.passed) }
		}, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewStore()
			a, b := newLocker(t, s), newLocker(t, s)
			h := mustAcquire(t, a, "k")
			ctx, end := tt.ctx(t.Context())
			ch := goAcquire(ctx, b, "k")
			waitQueued(t, s, "k", 1)
			end()
			r := await(t, ch, "abandoned Acquire")
			if !errors.Is(r.err, tt.want) {
				t.Fatalf("err = %v, want %v", r.err, tt.want)
			}
			if q := s.queued("k"); q != 0 {
				t.Fatalf("%d waiter(s) left in the queue", q)
			}
			if len(b.waiters) != 0 {
				t.Fatal("the Locker still tracks the abandoned waiter")
			}
			if err := h.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			if s.entries() != 0 {
				t.Fatal("the key is still held after its only holder released it")
			}
		})
	}
}

// TestCancelRacingHandoff ends waits at the moment the key is handed to
// them. Whichever wins, the key must end up free.
func TestCancelRacingHandoff(t *testing.T) {
	s := NewStore()
	a, b := newLocker(t, s), newLocker(t, s)
	var got, cancelled int
	for range 300 {
		h := mustAcquire(t, a, "k")
		ctx, cancel := context.WithCancel(t.Context())
		ch := goAcquire(ctx, b, "k")
		waitQueued(t, s, "k", 1)
		var wg sync.WaitGroup
		wg.Go(cancel)
		wg.Go(func() { _ = h.Release(t.Context()) })
		wg.Wait()
		r := await(t, ch, "racing Acquire")
		switch {
		case r.err == nil:
			got++
			if err := r.h.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		case errors.Is(r.err, context.Canceled):
			cancelled++
		default:
			t.Fatal(r.err)
		}
		if n := s.entries(); n != 0 {
			t.Fatalf("after the race (%d granted, %d cancelled so far) the key is still held", got, cancelled)
		}
	}
	t.Logf("granted %d, cancelled %d", got, cancelled)
}

// TestRenewalKeepsLockPastTTL holds a lock for three leases. The lease is
// long enough that only a stall of 2/3 of it (a third of a second) loses the
// lock: with shorter leases, a loaded machine running -race makes this fail
// for real, which is the loss the watchdog exists to report.
func TestRenewalKeepsLockPastTTL(t *testing.T) {
	s := NewStore()
	a, b := newLocker(t, s), newLocker(t, s)
	const ttl = time.Second
	h := mustAcquire(t, a, "k", locker.WithTTL(ttl))
	select {
	case <-h.Done():
		t.Fatalf("lost a renewed lock: %v", h.Err())
	case <-time.After(3 * ttl):
	}
	if _, err := b.TryAcquire(t.Context(), "k"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a renewed lock: %v", err)
	}
	if err := h.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestReleaseTwice(t *testing.T) {
	l := newLocker(t, NewStore())
	h := mustAcquire(t, l, "k")
	if err := h.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(h.Err(), locker.ErrReleased) || !isClosed(h.Done()) {
		t.Fatalf("after Release: done=%v err=%v", isClosed(h.Done()), h.Err())
	}
	err := h.Release(t.Context())
	var e *locker.Error
	if !errors.Is(err, locker.ErrReleased) || !errors.As(err, &e) || e.Op != "release" || e.Key != "k" {
		t.Fatalf("second Release: %v, want a release error on \"k\" wrapping ErrReleased", err)
	}
}

// TestExclusionUnderContention hammers one key from several Lockers and
// checks that holders never overlap and tokens only grow.
func TestExclusionUnderContention(t *testing.T) {
	s := NewStore()
	var inside atomic.Int32
	var mu sync.Mutex
	var tokens []int64
	var wg sync.WaitGroup
	for range 4 {
		l := newLocker(t, s)
		for range 4 {
			wg.Go(func() {
				for range 200 {
					h, err := l.Acquire(testCtx(t), "k")
					if err != nil {
						t.Error(err)
						return
					}
					if inside.Add(1) != 1 {
						t.Error("two holders at once")
					}
					mu.Lock()
					tokens = append(tokens, h.Token())
					mu.Unlock()
					inside.Add(-1)
					if err := h.Release(t.Context()); err != nil {
						t.Error(err)
					}
				}
			})
		}
	}
	wg.Wait()
	if !slices.IsSorted(tokens) || len(slices.Compact(slices.Clone(tokens))) != len(tokens) {
		t.Fatal("tokens did not strictly increase in the order holders got the key")
	}
}

// BenchmarkAcquireRelease measures one uncontended Acquire+Release, next to a
// sync.Mutex Lock+Unlock as the floor.
func BenchmarkAcquireRelease(b *testing.B) {
	b.Run("memlock", func(b *testing.B) {
		l := NewStore().NewLocker()
		defer l.Close()
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			h, err := l.Acquire(ctx, "bench")
			if err != nil {
				b.Fatal(err)
			}
			if err := h.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sync.Mutex", func(b *testing.B) {
		var mu sync.Mutex
		n := 0
		b.ReportAllocs()
		for b.Loop() {
			mu.Lock()
			n++
			mu.Unlock()
		}
		_ = n
	})
}

// BenchmarkTryAcquireHeld measures a TryAcquire that finds the key held.
func BenchmarkTryAcquireHeld(b *testing.B) {
	s := NewStore()
	holder, l := s.NewLocker(), s.NewLocker()
	defer holder.Close()
	defer l.Close()
	ctx := context.Background()
	h, err := holder.Acquire(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer h.Release(ctx)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.TryAcquire(ctx, "bench"); !errors.Is(err, locker.ErrNotAcquired) {
			b.Fatal(err)
		}
	}
}

// BenchmarkHandoff measures the time from a Release to the moment the
// waiting Acquire on another Locker returns holding the key.
func BenchmarkHandoff(b *testing.B) {
	s := NewStore()
	holder, waiter := s.NewLocker(), s.NewLocker()
	defer holder.Close()
	defer waiter.Close()
	ctx := context.Background()
	type taken struct {
		h  locker.Handle
		at time.Time
	}
	got := make(chan taken)
	var lat []time.Duration
	for b.Loop() {
		h, err := holder.Acquire(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			hw, err := waiter.Acquire(ctx, "bench")
			if err != nil {
				panic(err)
			}
			got <- taken{hw, time.Now()}
		}()
		for s.queued("bench") != 1 {
			runtime.Gosched()
		}
		start := time.Now()
		if err := h.Release(ctx); err != nil {
			b.Fatal(err)
		}
		t := <-got
		lat = append(lat, t.at.Sub(start))
		if err := t.h.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	benchstats.ReportPercentiles(b, lat)
}

// BenchmarkContended measures throughput of 8 goroutines on 8 Lockers taking
// turns on one key; each op is one Acquire+Release, and every Acquire but
// the uncontended ones is a handoff between goroutines.
func BenchmarkContended(b *testing.B) {
	const goroutines = 8
	s := NewStore()
	ctx := context.Background()
	lockers := make([]*Locker, goroutines)
	for i := range lockers {
		lockers[i] = s.NewLocker()
		defer lockers[i].Close()
	}
	var next atomic.Int64
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for _, l := range lockers {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				h, err := l.Acquire(ctx, "bench")
				if err != nil {
					panic(err)
				}
				if err := h.Release(ctx); err != nil {
					panic(err)
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
}

func TestErrReportsBadOptionAtOnce(t *testing.T) {
	l := NewStore().NewLocker(WithDefaultTTL(0))
	defer l.Close()
	if err := l.Err(); !errors.Is(err, locker.ErrInvalidOption) {
		t.Fatalf("Err() = %v, want ErrInvalidOption", err)
	}
	if _, err := l.TryAcquire(context.Background(), "k"); !errors.Is(err, locker.ErrInvalidOption) {
		t.Fatalf("TryAcquire = %v, want the same ErrInvalidOption", err)
	}
	ok := NewStore().NewLocker()
	defer ok.Close()
	if err := ok.Err(); err != nil {
		t.Fatalf("Err() of a well-built Locker = %v", err)
	}
}

// TestRevokeToken: RevokeToken takes away exactly the holder it names, in
// any family, tells it, and lets the next waiter in with a higher token.
func TestRevokeToken(t *testing.T) {
	ctx := testCtx(t)
	s := NewStore()
	l := s.NewLocker()
	defer l.Close()
	a, err := l.TryAcquireSemaphore(ctx, "k", 2)
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.TryAcquireSemaphore(ctx, "k", 2)
	if err != nil {
		t.Fatal(err)
	}
	r, err := l.TryAcquireRead(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if s.RevokeToken("k", 1<<40) || s.RevokeToken("other", a.Token()) {
		t.Fatal("RevokeToken found a holder that does not exist")
	}
	waiting := make(chan locker.Handle, 1)
	go func() {
		h, err := l.AcquireSemaphore(ctx, "k", 2)
		if err != nil {
			t.Error(err)
		}
		waiting <- h
	}()
	// The store has no signal for a queued waiter: look until it is there.
	for deadline := time.Now().Add(bound); ; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		n := s.keys[storeKey(semaphoreMode(2), "k")].waiters.Len()
		s.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter did not queue")
		}
	}
	if !s.RevokeToken("k", a.Token()) {
		t.Fatal("RevokeToken did not find the first permit")
	}
	<-a.Done()
	if !errors.Is(a.Err(), locker.ErrLost) {
		t.Errorf("revoked permit: Err = %v, want ErrLost", a.Err())
	}
	if b.Err() != nil || r.Err() != nil {
		t.Errorf("RevokeToken touched other holders: %v, %v", b.Err(), r.Err())
	}
	c := <-waiting
	if c == nil {
		return
	}
	if c.Token() <= r.Token() {
		t.Errorf("the waiter got token %d, not above the earlier %d", c.Token(), r.Token())
	}
	if !s.RevokeToken("k", r.Token()) {
		t.Fatal("RevokeToken did not find the read lock")
	}
	if !errors.Is(r.Err(), locker.ErrLost) {
		t.Errorf("revoked read lock: Err = %v, want ErrLost", r.Err())
	}
	if err := a.Release(ctx); !errors.Is(err, locker.ErrLost) {
		t.Errorf("Release of a revoked permit = %v, want ErrLost", err)
	}
	for _, h := range []locker.Handle{b, c} {
		if err := h.Release(ctx); err != nil {
			t.Error(err)
		}
	}
}
