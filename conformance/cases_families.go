package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// The lock families (locker.Semaphorer, locker.ReadWriter) and multi-locks
// (locker.AcquireAll). A backend that does not implement a family skips its
// cases, saying so; the Multi cases need nothing of the backend and run on
// every one. The cases go through the root package's views (locker.Semaphore,
// locker.ReadLock, locker.WriteLock), as users do.

// semLimit is the n of the semaphore cases.
const semLimit = 3

// needSemaphores skips the test when the backend has no semaphores.
func (s *suite) needSemaphores(t *testing.T) {
	t.Helper()
	if _, ok := s.newLocker(t).(locker.Semaphorer); !ok {
		t.Skip("conformance: the backend has no semaphores (its Locker does not implement locker.Semaphorer)")
	}
}

// needRW skips the test when the backend has no reader-writer locks.
func (s *suite) needRW(t *testing.T) {
	t.Helper()
	if _, ok := s.newLocker(t).(locker.ReadWriter); !ok {
		t.Skip("conformance: the backend has no reader-writer locks (its Locker does not implement locker.ReadWriter)")
	}
}

// semAdmitsN: n permits are granted to n holders at once (of several
// Lockers), with strictly increasing tokens; the next TryAcquire fails with
// ErrNotAcquired; a released permit is granted again with a greater token.
func (s *suite) semAdmitsN(t *testing.T, ctx context.Context) {
	s.needSemaphores(t)
	k := key(t, "")
	ls := []locker.Locker{locker.Semaphore(s.newLocker(t), semLimit), locker.Semaphore(s.newLocker(t), semLimit)}
	var held []locker.Handle
	for i := range semLimit {
		h := mustTry(t, ctx, ls[i%2], k)
		if len(held) > 0 && h.Token() <= held[len(held)-1].Token() {
			t.Errorf("permit %d has token %d, not above the previous permit's %d", i+1, h.Token(), held[len(held)-1].Token())
		}
		held = append(held, h)
	}
	mustNotTry(t, ctx, ls[1], k, fmt.Sprintf("its %d permits are held", semLimit))
	top := held[len(held)-1].Token()
	mustRelease(t, ctx, held[0])
	h := mustTry(t, ctx, ls[1], k)
	if h.Token() <= top {
		t.Errorf("a permit granted again has token %d, not above the last permit's %d", h.Token(), top)
	}
	mustRelease(t, ctx, h)
	for _, h := range held[1:] {
		mustRelease(t, ctx, h)
	}
}

// semLimit: Contenders × Goroutines callers contend for a semaphore of n;
// never more than n hold a permit at once, and n do at some moment.
func (s *suite) semContended(t *testing.T, ctx context.Context) {
	s.needSemaphores(t)
	k := key(t, "")
	var inside, most atomic.Int32
	tokens := newTokenSet()
	s.contend(t, ctx, 6, func(l locker.Locker) error {
		// The default TTL, as Acquire/MutualExclusion: under contention
		// on a loaded machine a short lease tests the machine, not the
		// semaphore (Semaphore/Crash tests the short lease).
		h, err := locker.Semaphore(l, semLimit).Acquire(ctx, k)
		if err != nil {
			return err
		}
		tokens.add(h.Token())
		n := inside.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(5 * time.Millisecond) // hold it a while, so that holders overlap
		inside.Add(-1)
		return h.Release(ctx)
	})
	if m := most.Load(); m > semLimit {
		t.Errorf("a semaphore of %d had %d holders at once", semLimit, m)
	} else {
		t.Logf("at most %d holders at once (limit %d)", m, semLimit)
	}
	tokens.check(t, "permits")
}

// tokenSet records the tokens of a key's locks: each must be the lock's
// own, even among permits or readers that hold at once.
type tokenSet struct {
	mu   sync.Mutex
	seen map[int64]int
}

func newTokenSet() *tokenSet { return &tokenSet{seen: map[int64]int{}} }

func (ts *tokenSet) add(token int64) {
	ts.mu.Lock()
	ts.seen[token]++
	ts.mu.Unlock()
}

// check fails t for every token given to more than one of what.
func (ts *tokenSet) check(t *testing.T, what string) {
	t.Helper()
	dups := 0
	for tok, n := range ts.seen {
		if n > 1 {
			if dups < 5 {
				t.Errorf("token %d was given to %d %s of one key: every lock needs a token of its own", tok, n, what)
			}
			dups++
		}
	}
	if dups > 5 {
		t.Errorf("… and %d more tokens given twice", dups-5)
	}
}

// contend runs fn rounds times in each of Contenders × Goroutines
// goroutines, each Contender with a Locker of its own, and fails the test on
// any error.
func (s *suite) contend(t *testing.T, ctx context.Context, rounds int, fn func(l locker.Locker) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, s.h.Contenders*s.h.Goroutines)
	for range s.h.Contenders {
		l := s.newLocker(t)
		for range s.h.Goroutines {
			wg.Go(func() {
				for range rounds {
					if err := fn(l); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("under contention: %v", err)
	}
}

// semLimitMismatch: a holder asking for a different n on a held key gets an
// error wrapping locker.ErrLimitMismatch at once (TryAcquire and Acquire),
// never a second limit; once the key is free, another n is fine.
func (s *suite) semLimitMismatch(t *testing.T, ctx context.Context) {
	s.needSemaphores(t)
	k := key(t, "")
	a, b := s.newLocker(t), s.newLocker(t)
	h := mustTry(t, ctx, locker.Semaphore(a, 2), k)
	for _, call := range []struct {
		name string
		f    func(context.Context, string, ...locker.Option) (locker.Handle, error)
	}{{"TryAcquire", locker.Semaphore(b, 3).TryAcquire}, {"Acquire", locker.Semaphore(b, 3).Acquire}} {
		cctx, cancel := context.WithTimeout(ctx, prompt)
		h2, err := call.f(cctx, k)
		cancel()
		if err == nil {
			_ = h2.Release(ctx)
			t.Errorf("%s with a limit of 3 on a key held as a semaphore of 2 succeeded; want an error wrapping locker.ErrLimitMismatch", call.name)
			continue
		}
		if !errors.Is(err, locker.ErrLimitMismatch) {
			t.Errorf("%s with a limit of 3 on a key held as a semaphore of 2: %v, want an error wrapping locker.ErrLimitMismatch, at once", call.name, err)
		}
	}
	mustRelease(t, ctx, h)
	h = mustTry(t, ctx, locker.Semaphore(b, 3), k)
	mustRelease(t, ctx, h)
}

// semInvalidLimit: a limit below 1 is refused with ErrInvalidOption, by the
// view and by the backend itself.
func (s *suite) semInvalidLimit(t *testing.T, ctx context.Context) {
	s.needSemaphores(t)
	l := s.newLocker(t)
	k := key(t, "")
	for _, n := range []int{0, -1} {
		if h, err := locker.Semaphore(l, n).TryAcquire(ctx, k); !errors.Is(err, locker.ErrInvalidOption) {
			if err == nil {
				_ = h.Release(ctx)
			}
			t.Errorf("Semaphore(l, %d).TryAcquire: %v, want an error wrapping locker.ErrInvalidOption", n, err)
		}
		if h, err := l.(locker.Semaphorer).TryAcquireSemaphore(ctx, k, n); !errors.Is(err, locker.ErrInvalidOption) {
			if err == nil {
				_ = h.Release(ctx)
			}
			t.Errorf("TryAcquireSemaphore(ctx, key, %d): %v, want an error wrapping locker.ErrInvalidOption", n, err)
		}
	}
}

// semWaiter: with every permit held, Acquire waits, and gets the permit
// promptly when one is released; a cancelled waiter leaves nothing behind
// (every permit can be taken after).
func (s *suite) semWaiter(t *testing.T, ctx context.Context) {
	s.needSemaphores(t)
	k := key(t, "")
	a, b := locker.Semaphore(s.newLocker(t), 2), locker.Semaphore(s.newLocker(t), 2)
	h1, h2 := mustTry(t, ctx, a, k), mustTry(t, ctx, a, k)
	cctx, cancel := context.WithCancel(ctx)
	gone := goAcquire(cctx, b, k)
	stillWaiting(t, gone, "Acquire of a semaphore whose permits are all held")
	cancel()
	if r := await(t, gone, prompt, "a cancelled wait for a permit"); r.err == nil {
		_ = r.h.Release(ctx)
		t.Fatal("an Acquire whose ctx was cancelled got a permit of a full semaphore")
	}
	waiting := goAcquire(ctx, b, k)
	stillWaiting(t, waiting, "Acquire of a semaphore whose permits are all held")
	released := time.Now()
	mustRelease(t, ctx, h1)
	r := await(t, waiting, s.h.HandoffBound+prompt, "the waiter for a released permit")
	if r.err != nil {
		t.Fatalf("the waiter for a released permit: %v", r.err)
	}
	t.Logf("a released permit reached its waiter in %v", r.at.Sub(released))
	if r.h.Token() <= h2.Token() {
		t.Errorf("the waiter's permit has token %d, not above %d", r.h.Token(), h2.Token())
	}
	mustRelease(t, ctx, r.h)
	mustRelease(t, ctx, h2)
	// The cancelled waiter left nothing: both permits can be had again.
	h3, h4 := mustTry(t, ctx, b, k), mustTry(t, ctx, a, k)
	mustRelease(t, ctx, h3)
	mustRelease(t, ctx, h4)
}

// semCrash: the permit of a holder that dies comes back within the
// expiry bound, to a waiter, with a greater token.
func (s *suite) semCrash(t *testing.T, ctx context.Context) {
	s.needSemaphores(t)
	if s.h.Crash == nil {
		t.Skip("conformance: Harness.Crash is not set")
	}
	k := key(t, "")
	dying, other := s.newLocker(t), s.newLocker(t)
	h := mustTry(t, ctx, locker.Semaphore(dying, 1), k, ttl(s))
	waiting := goAcquire(ctx, locker.Semaphore(other, 1), k, ttl(s))
	stillWaiting(t, waiting, "Acquire of a semaphore of 1 whose permit is held")
	s.h.Crash(t, dying)
	r := await(t, waiting, s.h.ExpiryBound+prompt, "the permit of a crashed holder")
	if r.err != nil {
		t.Fatalf("waiting for the permit of a crashed holder: %v", r.err)
	}
	if r.h.Token() <= h.Token() {
		t.Errorf("the permit after the crash has token %d, not above the crashed holder's %d", r.h.Token(), h.Token())
	}
	mustRelease(t, ctx, r.h)
}

// familiesApart: the mutex, the reader-writer lock and the semaphore of one
// key are three locks: each can be held while the others are.
func (s *suite) familiesApart(t *testing.T, ctx context.Context) {
	l := s.newLocker(t)
	k := key(t, "")
	held := []locker.Handle{mustTry(t, ctx, l, k)}
	if _, ok := l.(locker.Semaphorer); ok {
		held = append(held, mustTry(t, ctx, locker.Semaphore(l, 1), k))
	}
	if _, ok := l.(locker.ReadWriter); ok {
		held = append(held, mustTry(t, ctx, locker.WriteLock(l), k))
	}
	if len(held) == 1 {
		t.Skip("conformance: the backend has no lock family besides the mutex")
	}
	for _, h := range held {
		mustRelease(t, ctx, h)
	}
}

// rwReadersShare: readers of several Lockers hold a key at once, with
// increasing tokens; a writer cannot have it until the last reader leaves.
func (s *suite) rwReadersShare(t *testing.T, ctx context.Context) {
	s.needRW(t)
	k := key(t, "")
	ls := []locker.Locker{s.newLocker(t), s.newLocker(t), s.newLocker(t)}
	var readers []locker.Handle
	for _, l := range ls {
		h := mustTry(t, ctx, locker.ReadLock(l), k)
		if len(readers) > 0 && h.Token() <= readers[len(readers)-1].Token() {
			t.Errorf("reader token %d not above the previous reader's %d", h.Token(), readers[len(readers)-1].Token())
		}
		readers = append(readers, h)
	}
	w := locker.WriteLock(ls[0])
	mustNotTry(t, ctx, w, k, "readers hold it")
	waiting := goAcquire(ctx, w, k)
	for i, h := range readers {
		stillWaiting(t, waiting, fmt.Sprintf("a writer while %d reader(s) hold the key", len(readers)-i))
		mustRelease(t, ctx, h)
	}
	r := await(t, waiting, s.h.HandoffBound+prompt, "the writer after the last reader left")
	if r.err != nil {
		t.Fatalf("the writer after the last reader left: %v", r.err)
	}
	if r.h.Token() <= readers[len(readers)-1].Token() {
		t.Errorf("the writer's token %d is not above the last reader's %d: a resource that saw the reader would refuse the writer", r.h.Token(), readers[len(readers)-1].Token())
	}
	mustRelease(t, ctx, r.h)
}

// rwWriterExcludes: while a writer holds a key, neither a reader nor
// another writer can have it; a waiting reader gets it when the writer
// leaves.
func (s *suite) rwWriterExcludes(t *testing.T, ctx context.Context) {
	s.needRW(t)
	k := key(t, "")
	a, b := s.newLocker(t), s.newLocker(t)
	wh := mustTry(t, ctx, locker.WriteLock(a), k)
	mustNotTry(t, ctx, locker.ReadLock(b), k, "a writer holds it")
	mustNotTry(t, ctx, locker.WriteLock(b), k, "a writer holds it")
	waiting := goAcquire(ctx, locker.ReadLock(b), k)
	stillWaiting(t, waiting, "a reader while a writer holds the key")
	mustRelease(t, ctx, wh)
	r := await(t, waiting, s.h.HandoffBound+prompt, "the reader after the writer left")
	if r.err != nil {
		t.Fatalf("the reader after the writer left: %v", r.err)
	}
	if r.h.Token() <= wh.Token() {
		t.Errorf("the reader's token %d is not above the writer's %d", r.h.Token(), wh.Token())
	}
	mustRelease(t, ctx, r.h)
}

// rwWriterNotStarved: a writer waiting behind a reader is not overtaken by
// readers that come after it: TryAcquireRead fails while it waits, and it
// gets the key when the readers before it leave, while new readers keep
// arriving.
func (s *suite) rwWriterNotStarved(t *testing.T, ctx context.Context) {
	s.needRW(t)
	k := key(t, "")
	a, b, c := s.newLocker(t), s.newLocker(t), s.newLocker(t)
	first := mustTry(t, ctx, locker.ReadLock(a), k)
	writer := goAcquire(ctx, locker.WriteLock(b), k)
	stillWaiting(t, writer, "a writer while a reader holds the key")
	mustNotTry(t, ctx, locker.ReadLock(c), k, "a writer waits for it (readers must not overtake a waiting writer)")
	// A stream of readers arrives behind the writer.
	late := goAcquire(ctx, locker.ReadLock(c), k)
	stillWaiting(t, late, "a reader that came after a waiting writer")
	mustRelease(t, ctx, first)
	r := await(t, writer, s.h.HandoffBound+prompt, "the writer after the first reader left")
	if r.err != nil {
		t.Fatalf("the writer after the first reader left: %v", r.err)
	}
	stillWaiting(t, late, "a reader while the writer holds the key")
	mustRelease(t, ctx, r.h)
	lr := await(t, late, s.h.HandoffBound+prompt, "the late reader after the writer left")
	if lr.err != nil {
		t.Fatalf("the late reader after the writer left: %v", lr.err)
	}
	mustRelease(t, ctx, lr.h)
}

// rwCancelledWriter: readers queued behind a writer that gives up its wait
// get the key at once (they were held back only by the writer).
func (s *suite) rwCancelledWriter(t *testing.T, ctx context.Context) {
	s.needRW(t)
	k := key(t, "")
	a, b, c := s.newLocker(t), s.newLocker(t), s.newLocker(t)
	first := mustTry(t, ctx, locker.ReadLock(a), k)
	wctx, cancel := context.WithCancel(ctx)
	writer := goAcquire(wctx, locker.WriteLock(b), k)
	stillWaiting(t, writer, "a writer while a reader holds the key")
	late := goAcquire(ctx, locker.ReadLock(c), k)
	stillWaiting(t, late, "a reader that came after a waiting writer")
	cancel()
	if r := await(t, writer, prompt, "a cancelled writer"); r.err == nil {
		_ = r.h.Release(ctx)
		t.Fatal("a writer whose ctx was cancelled got a key a reader holds")
	}
	r := await(t, late, s.h.HandoffBound+prompt, "a reader once the writer before it gave up")
	if r.err != nil {
		t.Fatalf("a reader once the writer before it gave up: %v", r.err)
	}
	mustRelease(t, ctx, r.h)
	mustRelease(t, ctx, first)
	// Nothing is left of the writer: a writer gets the key at once.
	mustRelease(t, ctx, mustTry(t, ctx, locker.WriteLock(c), k))
}

// rwContended: readers and writers of several Lockers contend for one key:
// a writer is always alone, readers share, a writer's token is above every
// token granted before it, and a reader's above every writer's before it.
func (s *suite) rwContended(t *testing.T, ctx context.Context) {
	s.needRW(t)
	k := key(t, "")
	var (
		mu                   sync.Mutex
		readers, writers     int
		maxToken, maxWriter  int64
		sharedSeen, overlaps int
		stale                []string
		n                    atomic.Int32
		tokens               = newTokenSet()
	)
	s.contend(t, ctx, 6, func(l locker.Locker) error {
		write := n.Add(1)%4 == 0 // one in four is a writer
		v := locker.ReadLock(l)
		if write {
			v = locker.WriteLock(l)
		}
		h, err := v.Acquire(ctx, k) // the default TTL, as in semContended
		if err != nil {
			return err
		}
		tokens.add(h.Token())
		mu.Lock()
		tok := h.Token()
		if write {
			writers++
			if readers > 0 || writers > 1 {
				overlaps++
			}
			if tok <= maxToken {
				stale = append(stale, fmt.Sprintf("writer token %d after token %d", tok, maxToken))
			}
			maxWriter = max(maxWriter, tok)
		} else {
			readers++
			if writers > 0 {
				overlaps++
			}
			if readers > 1 {
				sharedSeen++
			}
			if tok <= maxWriter {
				stale = append(stale, fmt.Sprintf("reader token %d after writer token %d", tok, maxWriter))
			}
		}
		maxToken = max(maxToken, tok)
		mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		if write {
			writers--
		} else {
			readers--
		}
		mu.Unlock()
		return h.Release(ctx)
	})
	if overlaps > 0 {
		t.Errorf("a writer held the key beside another holder %d time(s)", overlaps)
	}
	for _, s := range stale[:min(len(stale), 5)] {
		t.Errorf("tokens out of order: %s", s)
	}
	tokens.check(t, "readers and writers")
	t.Logf("readers shared the key on %d acquisitions", sharedSeen)
}

// rwCrash: the write lock of a holder that dies comes back within the
// expiry bound, to a waiting reader, with a greater token.
func (s *suite) rwCrash(t *testing.T, ctx context.Context) {
	s.needRW(t)
	if s.h.Crash == nil {
		t.Skip("conformance: Harness.Crash is not set")
	}
	k := key(t, "")
	dying, other := s.newLocker(t), s.newLocker(t)
	h := mustTry(t, ctx, locker.WriteLock(dying), k, ttl(s))
	waiting := goAcquire(ctx, locker.ReadLock(other), k, ttl(s))
	stillWaiting(t, waiting, "a reader while a writer holds the key")
	s.h.Crash(t, dying)
	r := await(t, waiting, s.h.ExpiryBound+prompt, "the key of a crashed writer")
	if r.err != nil {
		t.Fatalf("waiting for the key of a crashed writer: %v", r.err)
	}
	if r.h.Token() <= h.Token() {
		t.Errorf("the reader after the crash has token %d, not above the crashed writer's %d", r.h.Token(), h.Token())
	}
	mustRelease(t, ctx, r.h)
}
