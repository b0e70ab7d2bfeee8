package benchmark

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// Held is the case of many locks held at once by one Locker, as a service
// that locks every entity it works on would: what the client pays for each
// lock it keeps, while it keeps it.
type Held struct {
	// Open opens the Locker; what it opens it closes with tb.Cleanup.
	Open func(tb testing.TB) locker.Locker
	// N is how many keys are held at the end; default 10,000. Small is a
	// first step, default N/100 and at least 2 × Parallel (so that the
	// takers have opened every connection they will): the goroutines and
	// memory per lock are the difference between the two, so that what
	// the Locker starts once (a pool's connections) does not count.
	N, Small int
	// TTL is the lease of the locks (locker.WithTTL); default
	// locker.DefaultTTL, what a lock gets without one.
	TTL time.Duration
	// Window is how long the renewal requests are counted while the N
	// locks are held; default TTL/2, more than the renewal interval of
	// the lease backends (TTL/3).
	Window time.Duration
	// Requests, if set, is the count of requests the Locker has sent so
	// far (a counting client hook, or the server's command count).
	Requests func() int64
	// Parallel is how many goroutines take the locks; default 64.
	Parallel int
	// Take, if set, takes one lock in place of TryAcquire (a semaphore's
	// permit, a reader's lock): the Held case of a lock family.
	Take func(ctx context.Context, l locker.Locker, key string, opts ...locker.Option) (locker.Handle, error)
}

func (h *Held) defaults() {
	if h.N <= 0 {
		h.N = 10000
	}
	if h.Parallel <= 0 {
		h.Parallel = 64
	}
	if h.Small <= 0 {
		h.Small = max(2*h.Parallel, h.N/100)
	}
	if h.TTL <= 0 {
		h.TTL = locker.DefaultTTL
	}
	if h.Window <= 0 {
		h.Window = h.TTL / 2
	}
}

// HeldResult is what MeasureHeld found.
type HeldResult struct {
	N, Small int
	// GoroutinesSmall and GoroutinesN are the process's goroutines with
	// Small and with N locks held (after the takers ended).
	GoroutinesSmall, GoroutinesN int
	// BytesPerLock is the live heap per held lock, from Small to N.
	BytesPerLock float64
	// RenewalsPerSec is the requests per second sent while the N locks
	// were held and nothing else ran (0 without Requests).
	RenewalsPerSec float64
	// Lost is how many of the N locks ended during the measurement (none
	// should: nothing faults). LostErrs says how the first few ended:
	// the key's index in the order taken and the handle's Err.
	Lost     int
	LostErrs []string
}

// lostReport is the failure message's tail for r's lost locks.
func (r HeldResult) lostReport() string {
	if r.Lost == 0 {
		return ""
	}
	return fmt.Sprintf("; the first of them:\n%s", strings.Join(r.LostErrs, "\n"))
}

// GoroutinesPerLock is the goroutines each held lock adds.
func (r HeldResult) GoroutinesPerLock() float64 {
	return float64(r.GoroutinesN-r.GoroutinesSmall) / float64(r.N-r.Small)
}

// MeasureHeld takes Small, then N keys with one Locker, measuring the
// goroutines and live heap at each step, then counts the requests sent over
// Window while the N locks are held, and releases them all.
func MeasureHeld(tb testing.TB, h Held) HeldResult {
	tb.Helper()
	h.defaults()
	l := h.Open(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	base := fmt.Sprintf("held/%d/", time.Now().UnixNano())
	handles := make([]locker.Handle, 0, h.N)
	takeOne := h.Take
	if takeOne == nil {
		takeOne = func(ctx context.Context, l locker.Locker, key string, opts ...locker.Option) (locker.Handle, error) {
			return l.TryAcquire(ctx, key, opts...)
		}
	}
	take := func(from, to int) {
		out := make([]locker.Handle, to-from)
		errs := make([]error, to-from)
		var wg sync.WaitGroup
		next := make(chan int)
		for range h.Parallel {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					out[i-from], errs[i-from] = takeOne(ctx, l, fmt.Sprintf("%s%d", base, i), locker.WithTTL(h.TTL))
				}
			}()
		}
		for i := from; i < to; i++ {
			next <- i
		}
		close(next)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				tb.Fatalf("benchmark.MeasureHeld: taking key %d: %v", from+i, err)
			}
		}
		handles = append(handles, out...)
	}
	tb.Cleanup(func() {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		sem := make(chan struct{}, h.Parallel)
		var wg sync.WaitGroup
		for _, hd := range handles {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				_ = hd.Release(rctx)
			}()
		}
		wg.Wait()
	})
	settle := func() (int, uint64) {
		// Goroutines that end after their work (the takers, a client's
		// own, a backend's per-lock start-up work such as ZooKeeper's
		// watch arming) get the time to end: the count is taken once it
		// has not gone down for settleQuiet (at most settleMax), so that
		// on a loaded machine work still in flight is not counted as
		// held, while goroutines that stay with the locks are. The heap
		// is measured after two collections.
		g := runtime.NumGoroutine()
		low, lowAt, start := g, time.Now(), time.Now()
		for time.Since(lowAt) < settleQuiet && time.Since(start) < settleMax {
			time.Sleep(10 * time.Millisecond)
			if g = runtime.NumGoroutine(); g < low {
				low, lowAt = g, time.Now()
			}
		}
		g = low
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return g, ms.HeapAlloc
	}
	r := HeldResult{N: h.N, Small: h.Small}
	take(0, h.Small)
	var heapSmall, heapN uint64
	r.GoroutinesSmall, heapSmall = settle()
	take(h.Small, h.N)
	r.GoroutinesN, heapN = settle()
	r.BytesPerLock = (float64(heapN) - float64(heapSmall)) / float64(h.N-h.Small)
	if h.Requests != nil {
		from, start := h.Requests(), time.Now()
		time.Sleep(h.Window)
		r.RenewalsPerSec = float64(h.Requests()-from) / time.Since(start).Seconds()
	}
	for i, hd := range handles {
		select {
		case <-hd.Done():
			r.Lost++
			if len(r.LostErrs) < 5 {
				r.LostErrs = append(r.LostErrs, fmt.Sprintf("key %d of %d taken: %v", i, len(handles), hd.Err()))
			}
		default:
		}
	}
	return r
}

// RunHeld is MeasureHeld as a benchmark: it reports goroutines/lock,
// B/lock (live heap), renew-req/s and renew-req/s/lock (with Requests), and
// fails if a lock was lost. b.N is not used: the case runs once.
func RunHeld(b *testing.B, h Held) {
	r := MeasureHeld(b, h)
	if r.Lost > 0 {
		b.Fatalf("%d of %d held locks ended while held, with no fault%s", r.Lost, r.N, r.lostReport())
	}
	b.ReportMetric(r.GoroutinesPerLock(), "goroutines/lock")
	b.ReportMetric(r.BytesPerLock, "B/lock")
	if h.Requests != nil {
		b.ReportMetric(r.RenewalsPerSec, "renew-req/s")
		b.ReportMetric(r.RenewalsPerSec/float64(r.N), "renew-req/s/lock")
	}
}

// settleQuiet and settleMax bound MeasureHeld's wait for the goroutines of
// work in flight to end (see settle there).
const (
	settleQuiet = 300 * time.Millisecond
	settleMax   = 15 * time.Second
)

// CheckHeldGoroutines is the test of the Held case: it measures h (N
// 2,000 unless set) and fails t if the Locker runs more than a few
// goroutines more with N locks held than with Small (a goroutine per held
// lock would be N−Small more), or if a lock ended with no fault. Requests
// are not counted (the rate is RunHeld's).
func CheckHeldGoroutines(t *testing.T, h Held) {
	t.Helper()
	if h.N <= 0 {
		h.N = 2000
	}
	h.Requests = nil
	r := MeasureHeld(t, h)
	t.Logf("%d locks: %d goroutines; %d locks: %d; %.0f B/lock", r.Small, r.GoroutinesSmall, r.N, r.GoroutinesN, r.BytesPerLock)
	if d := r.GoroutinesN - r.GoroutinesSmall; d > 8 {
		t.Errorf("%d goroutines more with %d locks held than with %d: a held lock must not cost a goroutine", d, r.N, r.Small)
	}
	if r.Lost > 0 {
		t.Errorf("%d held locks ended with no fault%s", r.Lost, r.lostReport())
	}
}

// CheckRenewalsBatched is the test of renewal batching (a Locker that sends
// the renewals of many held locks together, lease.Batcher): it holds N
// locks (1,000 unless set) of a short lease (TTL 3s unless set; Window
// one TTL, three renewal rounds) and fails t unless the Locker sent, per
// renewal interval (TTL/3), at most a tenth as many requests as it holds
// locks; a renewal per lock would be ten times that. h.Requests must count
// the Locker's requests. A lock that ended fails it too.
func CheckRenewalsBatched(t *testing.T, h Held) {
	t.Helper()
	if h.Requests == nil {
		t.Fatal("benchmark.CheckRenewalsBatched: Held.Requests is not set")
	}
	if h.N <= 0 {
		h.N = 1000
	}
	if h.TTL <= 0 {
		// Not shorter: a loaded machine (parallel packages under -race)
		// must renew a thousand locks well within their leases.
		h.TTL = 3 * time.Second
	}
	if h.Window <= 0 {
		h.Window = h.TTL
	}
	r := MeasureHeld(t, h)
	perRound := r.RenewalsPerSec * (h.TTL / 3).Seconds()
	t.Logf("%d locks held, TTL %v: %.1f requests per renewal interval (%.2f per lock)", r.N, h.TTL, perRound, perRound/float64(r.N))
	if perRound > float64(r.N)/10 {
		t.Errorf("%.1f requests per renewal interval for %d held locks: the renewals are not batched (at most %d expected)", perRound, r.N, r.N/10)
	}
	if r.Lost > 0 {
		t.Errorf("%d held locks ended with no fault%s", r.Lost, r.lostReport())
	}
}

// TakeSemaphorePermit is a Held.Take that takes one of 2 permits of the key
// (locker.Semaphorer): the Held case of the semaphore.
func TakeSemaphorePermit(ctx context.Context, l locker.Locker, key string, opts ...locker.Option) (locker.Handle, error) {
	s, ok := l.(locker.Semaphorer)
	if !ok {
		return nil, fmt.Errorf("benchmark: %T is not a locker.Semaphorer", l)
	}
	return s.TryAcquireSemaphore(ctx, key, 2, opts...)
}

// TakeRead is a Held.Take that takes a reader's lock on the key
// (locker.ReadWriter): the Held case of the reader-writer lock.
func TakeRead(ctx context.Context, l locker.Locker, key string, opts ...locker.Option) (locker.Handle, error) {
	rw, ok := l.(locker.ReadWriter)
	if !ok {
		return nil, fmt.Errorf("benchmark: %T is not a locker.ReadWriter", l)
	}
	return rw.TryAcquireRead(ctx, key, opts...)
}
