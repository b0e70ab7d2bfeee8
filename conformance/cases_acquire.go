package conformance

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// handleAccessors: a handle describes itself, and Release changes what it says.
func (s *suite) handleAccessors(t *testing.T, ctx context.Context) {
	l := s.newLocker(t)
	k := key(t, "")
	h := mustAcquire(t, ctx, l, k)
	token := h.Token()
	mustRelease(t, ctx, h)
	if h.Key() != k {
		t.Errorf("Key() after Release = %q, want %q", h.Key(), k)
	}
	if h.Token() != token {
		t.Errorf("Token() changed from %d to %d on Release", token, h.Token())
	}
}

// mutualExclusion: several clients with several goroutines each hammer one
// key. A counter shows whether two ever held it at once, and the tokens, in
// the order the holders observed them, must strictly increase.
func (s *suite) mutualExclusion(t *testing.T, ctx context.Context) {
	const rounds = 8
	k := key(t, "")
	var (
		inside   atomic.Int32
		overlaps atomic.Int32
		mu       sync.Mutex
		tokens   []int64
		wg       sync.WaitGroup
		errs     = make(chan error, s.h.Contenders*s.h.Goroutines)
	)
	for range s.h.Contenders {
		l := s.newLocker(t)
		for range s.h.Goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					h, err := l.Acquire(ctx, k)
					if err != nil {
						errs <- err
						return
					}
					if inside.Add(1) != 1 {
						overlaps.Add(1)
					}
					mu.Lock()
					tokens = append(tokens, h.Token())
					mu.Unlock()
					time.Sleep(time.Millisecond) // hold it for a while, so overlaps have a window
					inside.Add(-1)
					if err := h.Release(ctx); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Acquire/Release under contention: %v", err)
	}
	if n := overlaps.Load(); n > 0 {
		t.Errorf("mutual exclusion broken: %d acquisitions found another holder inside", n)
	}
	want := s.h.Contenders * s.h.Goroutines * rounds
	if len(tokens) != want && !t.Failed() {
		t.Errorf("%d acquisitions recorded, want %d", len(tokens), want)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Errorf("fencing tokens not strictly increasing: holder %d got %d after %d", i, tokens[i], tokens[i-1])
			break
		}
	}
	t.Logf("%d acquisitions by %d clients × %d goroutines; tokens %d..%d", len(tokens), s.h.Contenders, s.h.Goroutines, first(tokens), last(tokens))
}

func first(x []int64) int64 {
	if len(x) == 0 {
		return 0
	}
	return x[0]
}

func last(x []int64) int64 {
	if len(x) == 0 {
		return 0
	}
	return x[len(x)-1]
}

// waitsForRelease: Acquire waits while another client holds the key, and
// holds it soon after the release. The key passes back and forth between two
// clients a few times; the median handoff must be within HandoffBound, so a
// waiter that sleeps between attempts is caught while one slow handoff on a
// loaded machine is forgiven. The handoff times are logged.
func (s *suite) waitsForRelease(t *testing.T, ctx context.Context) {
	const rounds = 5
	ls := [2]locker.Locker{s.newLocker(t), s.newLocker(t)}
	k := key(t, "")
	holder := mustAcquire(t, ctx, ls[0], k)
	handoffs := make([]time.Duration, 0, rounds)
	for i := range rounds {
		ch := goAcquire(ctx, ls[(i+1)%2], k)
		stillWaiting(t, ch, "Acquire of a held key")
		released := time.Now()
		mustRelease(t, ctx, holder)
		r := await(t, ch, s.h.HandoffBound+prompt, "Acquire after the holder released")
		if r.err != nil {
			t.Fatalf("Acquire after release: %v", r.err)
		}
		handoffs = append(handoffs, r.at.Sub(released))
		checkHeld(t, r.h, k)
		if r.h.Token() <= holder.Token() {
			t.Errorf("waiter's token %d is not greater than the previous holder's %d", r.h.Token(), holder.Token())
		}
		holder = r.h
	}
	mustRelease(t, ctx, holder)
	median := slices.Sorted(slices.Values(handoffs))[rounds/2]
	t.Logf("handoff from release to the waiter holding the lock: median %v of %v", median, handoffs)
	if median > s.h.HandoffBound {
		t.Errorf("median handoff %v (of %v) is more than HandoffBound %v: waiters must be woken by the release, not by polling or lease expiry", median, handoffs, s.h.HandoffBound)
	}
}

// notReentrant: a Locker that holds a key waits for it like anyone else.
func (s *suite) notReentrant(t *testing.T, ctx context.Context) {
	l := s.newLocker(t)
	k := key(t, "")
	h := mustAcquire(t, ctx, l, k)
	mustNotTry(t, ctx, l, k, "the same Locker already holds it (locks are not reentrant)")
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	r := await(t, goAcquire(wctx, l, k), 300*time.Millisecond+prompt, "second Acquire from the same Locker with a deadline")
	if r.err == nil {
		_ = r.h.Release(ctx)
		t.Fatal("a second Acquire from the same Locker succeeded while the first still held the key")
	}
	if !errors.Is(r.err, context.DeadlineExceeded) {
		t.Errorf("second Acquire from the same Locker: %v, want an error wrapping context.DeadlineExceeded", r.err)
	}
	mustRelease(t, ctx, h)
}

// tryAcquireHeld: TryAcquire fails at once on a held key, takes nothing in
// failing, and succeeds once the key is free.
func (s *suite) tryAcquireHeld(t *testing.T, ctx context.Context) {
	a, b, c := s.newLocker(t), s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	ha := mustAcquire(t, ctx, a, k)
	// One attempt, not a wait: the quickest of a few failed tries must take
	// about a round trip. (One slow try on a loaded machine is forgiven; a
	// TryAcquire that retries or waits for a while is slow every time.)
	quickest := prompt
	for range 3 {
		quickest = min(quickest, mustNotTry(t, ctx, b, k, "another client holds it"))
	}
	t.Logf("quickest failed TryAcquire: %v", quickest)
	if quickest > quick {
		t.Errorf("a TryAcquire of a held key took at least %v, every time: it must make one attempt and not wait for the holder", quickest)
	}
	mustRelease(t, ctx, ha)
	// b's failed attempt must have left nothing: c gets the key at once.
	hc := mustTry(t, ctx, c, k)
	if hc.Token() <= ha.Token() {
		t.Errorf("token %d after release is not greater than the previous holder's %d", hc.Token(), ha.Token())
	}
	mustNotTry(t, ctx, b, k, "c holds it")
	mustRelease(t, ctx, hc)
	hb := mustTry(t, ctx, b, k)
	mustRelease(t, ctx, hb)
}

// tryBurst: many clients TryAcquire one free key at the same moment; exactly
// one wins and every other gets ErrNotAcquired, and nothing else. A
// TryAcquire that checks, then sets, lets several win. Repeated on fresh keys.
func (s *suite) tryBurst(t *testing.T, ctx context.Context) {
	const rounds = 5
	ls := make([]locker.Locker, s.h.Contenders)
	for i := range ls {
		ls[i] = s.newLocker(t)
	}
	n := s.h.Contenders * s.h.Goroutines
	for round := range rounds {
		k := key(t, "/"+itoa(round))
		var (
			start = make(chan struct{})
			res   = make(chan result, n)
		)
		for i := range n {
			l := ls[i%len(ls)]
			go func() {
				<-start
				h, err := l.TryAcquire(ctx, k)
				res <- result{h, err, time.Now()}
			}()
		}
		close(start)
		var won []locker.Handle
		for range n {
			r := await(t, res, prompt, "TryAcquire in a burst")
			switch {
			case r.err == nil:
				won = append(won, r.h)
			case errors.Is(r.err, locker.ErrNotAcquired):
				checkKeyError(t, r.err, k, "TryAcquire that lost a burst")
			default:
				t.Errorf("TryAcquire in a burst of %d on a free key: %v, want success or an error wrapping locker.ErrNotAcquired", n, r.err)
			}
		}
		if len(won) != 1 {
			t.Errorf("round %d: %d of %d concurrent TryAcquires of one free key succeeded, want exactly 1", round, len(won), n)
		}
		for _, h := range won {
			_ = h.Release(ctx)
		}
		if t.Failed() {
			return
		}
	}
}
