package benchmark

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-locker/locker"
)

// Lock takes a lock, waiting as long as ctx allows (a competitor whose
// lock takes no context may ignore it), and returns what gives it back.
type Lock func(ctx context.Context) (release func(context.Context) error, err error)

// LockOf is the Lock of key on l, taken with Acquire and opts.
func LockOf(l locker.Locker, key string, opts ...locker.Option) Lock {
	return func(ctx context.Context) (func(context.Context) error, error) {
		h, err := l.Acquire(ctx, key, opts...)
		if err != nil {
			return nil, err
		}
		return h.Release, nil
	}
}

// Cycle takes and gives back lock once, the release bounded by
// releaseTimeout whatever becomes of ctx, and returns how long both took.
func Cycle(ctx context.Context, lock Lock, releaseTimeout time.Duration) (time.Duration, error) {
	t0 := time.Now()
	release, err := lock(ctx)
	if err != nil {
		return 0, err
	}
	if err := releaseWithin(release, releaseTimeout); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

func releaseWithin(release func(context.Context) error, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return release(ctx)
}

// Mode is how a Group's contenders take turns.
type Mode int

const (
	// Handoff: the holder waits until every other contender is inside its
	// Lock, holds for Hold, then releases; one that released waits for the
	// next holder before it asks again, so that every acquisition is a
	// handoff to another contender. A phase counts handoffs: acquisitions
	// that follow a release of the same phase.
	Handoff Mode = iota
	// Contended: every contender takes and releases the lock as fast as it
	// can, holding it for Hold. A phase counts acquisitions.
	Contended
)

// Group is the contenders of one lock, one goroutine each (like separate
// processes when each Lock has a client of its own), run in phases: between
// phases every contender is parked, so that groups of several
// implementations can take turns on one machine. The fields after Stall
// are totals over the phases run.
type Group struct {
	Mode           Mode
	Hold           time.Duration // how long a holder keeps the lock
	ReleaseTimeout time.Duration // bound on each release; default 10s
	// Stall fails a phase in which no contender takes the lock for that
	// long; 0 never.
	Stall time.Duration
	// OnCount, if set, is called for each counted acquisition.
	OnCount func()
	// Limit is how many may hold at once (a semaphore's n); 0 or 1: one,
	// a lock. More holders fail the phase.
	Limit int

	// Handoffs: from the start of a release to the return of the next
	// counted acquisition (after the first of a phase).
	Handoffs []time.Duration
	// Waits: from the call of Lock to its return, counted acquisitions.
	Waits    []time.Duration
	Counts   []int // counted acquisitions per contender
	Acquired int   // counted acquisitions
	Elapsed  time.Duration

	locks []Lock
	wg    sync.WaitGroup

	mu        sync.Mutex
	cond      *sync.Cond
	started   bool
	on        bool // the phase is on
	quit      bool
	atGate    int
	inAcquire int
	holding   int
	gen       int // acquisitions so far, counted or not
	quota     int // to count in this phase; <0 until the phase ends
	released  time.Time
	ctx       context.Context         // the phase's
	cancel    context.CancelCauseFunc // ends ctx
	err       error                   // the phase's first error
}

// Phase runs the contenders until n acquisitions (Contended) or handoffs
// (Handoff) were counted, or, with n ≤ 0, until ctx ends, and returns once
// every contender is parked again. It returns the first error of a Lock or
// a release (a Lock that fails because ctx ended is none), or of a stall.
func (g *Group) Phase(ctx context.Context, n int) error {
	g.start()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	g.mu.Lock()
	for g.atGate < len(g.locks) && !g.quit {
		g.cond.Wait()
	}
	if g.quit {
		g.mu.Unlock()
		return errors.New("benchmark: Phase after Stop")
	}
	g.on, g.quota, g.released, g.ctx, g.cancel, g.err = true, n, time.Time{}, ctx, cancel, nil
	if n <= 0 {
		g.quota = -1
	}
	g.cond.Broadcast()
	g.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { g.fail(nil) })
	defer stop()
	if g.Stall > 0 {
		done := make(chan struct{})
		defer close(done)
		go g.watch(done)
	}
	start := time.Now()
	g.mu.Lock()
	for (g.on || g.atGate < len(g.locks)) && !g.quit {
		g.cond.Wait()
	}
	err := g.err
	g.mu.Unlock()
	g.Elapsed += time.Since(start)
	return err
}

// watch fails the phase when no contender took the lock within Stall.
func (g *Group) watch(done <-chan struct{}) {
	t := time.NewTicker(g.Stall)
	defer t.Stop()
	last := -1
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		g.mu.Lock()
		stalled := g.gen == last && g.on
		last = g.gen
		waiting := g.inAcquire
		g.mu.Unlock()
		if stalled {
			err := fmt.Errorf("no contender took the lock within %v of the last acquisition (%d waiting)", g.Stall, waiting)
			g.fail(err)
		}
	}
}

// fail ends the phase, with err the first error if not nil; an error also
// ends the phase's context, so that the contenders waiting in their Lock
// return (a lock a failed release left behind might never come free).
func (g *Group) fail(err error) {
	g.mu.Lock()
	if err != nil && g.err == nil && g.on {
		g.err = err
	}
	g.on = false
	g.cond.Broadcast()
	cancel := g.cancel
	g.mu.Unlock()
	if err != nil && cancel != nil {
		cancel(err)
	}
}

// Stop ends the contenders and waits for them.
func (g *Group) Stop() {
	if g.cond == nil {
		return
	}
	g.mu.Lock()
	g.quit = true
	g.cond.Broadcast()
	g.mu.Unlock()
	g.wg.Wait()
}

func (g *Group) start() {
	if g.started {
		return
	}
	g.started = true
	g.cond = sync.NewCond(&g.mu)
	if g.ReleaseTimeout <= 0 {
		g.ReleaseTimeout = 10 * time.Second
	}
	g.Counts = make([]int, len(g.locks))
	for i, lock := range g.locks {
		g.wg.Go(func() { g.contend(i, lock) })
	}
}

// NewGroup returns a Group of one contender per Lock, all on one lock;
// set its fields before the first Phase, and Stop it at the end.
func NewGroup(mode Mode, locks []Lock) *Group {
	return &Group{Mode: mode, locks: locks}
}

// contend is contender i: park at the gate until a phase is on, take the
// lock, count, hold, release, and again.
func (g *Group) contend(i int, lock Lock) {
	others := len(g.locks) - 1
	g.mu.Lock()
	defer g.mu.Unlock()
	for {
		g.atGate++
		g.cond.Broadcast()
		for !g.on && !g.quit {
			g.cond.Wait()
		}
		g.atGate--
		if g.quit {
			return
		}
		ctx := g.ctx
		g.inAcquire++
		g.cond.Broadcast()
		g.mu.Unlock()

		t0 := time.Now()
		release, err := lock(ctx)
		now := time.Now()

		g.mu.Lock()
		g.inAcquire--
		if err != nil {
			if ctx.Err() == nil {
				g.mu.Unlock()
				g.fail(err)
				g.mu.Lock()
			}
			continue
		}
		g.holding++
		if g.holding > max(g.Limit, 1) && g.err == nil {
			g.err, g.on = fmt.Errorf("%d holders at once, limit %d", g.holding, max(g.Limit, 1)), false
			g.cancel(g.err)
		}
		counted := g.on && g.quota != 0 && (g.Mode == Contended || !g.released.IsZero())
		if counted {
			if !g.released.IsZero() {
				g.Handoffs = append(g.Handoffs, now.Sub(g.released))
			}
			g.Waits = append(g.Waits, now.Sub(t0))
			g.Counts[i]++
			g.Acquired++
			if g.OnCount != nil {
				g.OnCount()
			}
			if g.quota > 0 {
				if g.quota--; g.quota == 0 {
					g.on = false
				}
			}
		}
		g.gen++
		gen := g.gen
		g.cond.Broadcast()
		if g.Mode == Handoff {
			for g.on && g.inAcquire < others && !g.quit {
				g.cond.Wait()
			}
		}
		hold := g.on && g.Hold > 0
		g.mu.Unlock()
		if hold {
			time.Sleep(g.Hold)
		}
		g.mu.Lock()
		if g.on {
			g.released = time.Now()
		}
		g.holding--
		g.mu.Unlock()
		err = releaseWithin(release, g.ReleaseTimeout)
		if err != nil {
			g.fail(err)
		}
		g.mu.Lock()
		if g.Mode == Handoff {
			for g.on && g.gen == gen && !g.quit {
				g.cond.Wait()
			}
		}
	}
}
