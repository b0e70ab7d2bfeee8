package backend

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-locker/locker"
)

// Life is the lifecycle that every Locker has, written once: it admits calls
// until Close (Enter), ties each call's context to Close, counts the calls
// and goroutines in progress so that Close can wait for them (Enter, Go,
// Run), keeps the set of held handles for Close to release (Hold, Drop), and
// runs a bounded two-phase Close (Close).
//
// The two phases of Close are two contexts. Closing ends (cause
// locker.ErrClosed) the moment Close begins: every call in progress and
// every wait gives up, and new calls are refused. Abandoned ends when Close
// stops waiting for what is still in flight (its grace is over): a
// goroutine that was finishing a clean-up on Closing's time gives up then.
//
// H is the backend's handle type; the zero value of Life is not usable:
// call NewLife.
type Life[H comparable] struct {
	closing, abandoned context.Context
	closeNow, abandon  context.CancelCauseFunc
	cfgErr             error
	mu                 sync.Mutex
	closed             bool // Close has begun: no calls admitted, no handles held
	drained            bool // Close has stopped waiting: no goroutines started
	held               map[H]struct{}
	calls              *entered[H]   // the calls Enter admitted, for Close to end
	active             int           // calls and goroutines in progress
	idle               chan struct{} // closed when active drops to 0 while Close waits
	closeDone          chan struct{} // closed when the first Close returns

	wmu     sync.Mutex
	workers []chan func() // idle goroutines of Reuse, waiting for a function
}

// NewLife returns the lifecycle of a new Locker. cfgErr is the error of an
// invalid option given to the Locker's constructor (nil when none was):
// Enter refuses every call with it, so that a bad option is reported by the
// first lock taken rather than ignored.
func NewLife[H comparable](cfgErr error) *Life[H] {
	l := &Life[H]{cfgErr: cfgErr, held: make(map[H]struct{}), closeDone: make(chan struct{})}
	l.closing, l.closeNow = context.WithCancelCause(context.Background())
	l.abandoned, l.abandon = context.WithCancelCause(context.Background())
	return l
}

// ConfigError is the cfgErr given to NewLife.
func (l *Life[H]) ConfigError() error { return l.cfgErr }

// Closing ends, with cause locker.ErrClosed, when Close begins.
func (l *Life[H]) Closing() context.Context { return l.closing }

// Abandoned ends, with cause locker.ErrClosed, when Close stops waiting for
// the calls and goroutines still in flight.
func (l *Life[H]) Abandoned() context.Context { return l.abandoned }

// IsClosing reports whether Close has begun.
func (l *Life[H]) IsClosing() bool { return l.closing.Err() != nil }

// Enter admits one call of op (such as "acquire") on key. It refuses it,
// with an error made by KeyError(op, key, ...), when the key is
// invalid (wrapping locker.ErrInvalidKey), an option given to the Locker was
// (the cfgErr of NewLife), Close has begun (locker.ErrClosed) or ctx has
// ended (see ContextError). Otherwise it returns a context that ends when
// ctx does or when Close begins, and done, which the call must run when it
// returns: Close waits for it (boundedly).
//
// A call that fails because the returned context ended reports Why.
func (l *Life[H]) Enter(ctx context.Context, op, key string) (context.Context, func(), error) {
	if err := locker.ValidateKey(key); err != nil {
		return nil, nil, KeyError(op, key, err)
	}
	if l.cfgErr != nil {
		return nil, nil, KeyError(op, key, l.cfgErr)
	}
	cctx, cancel := context.WithCancelCause(ctx)
	e := &entered[H]{l: l, cancel: cancel}
	l.mu.Lock()
	if l.drained || l.closed {
		l.mu.Unlock()
		cancel(locker.ErrClosed)
		return nil, nil, KeyError(op, key, locker.ErrClosed)
	}
	if ctx.Err() != nil {
		l.mu.Unlock()
		cancel(context.Canceled)
		return nil, nil, KeyError(op, key, ContextError(ctx))
	}
	l.active++
	e.next = l.calls
	if l.calls != nil {
		l.calls.prev = e
	}
	l.calls = e
	l.mu.Unlock()
	return cctx, e.exit, nil
}

// entered is a call that Enter admitted: Close cancels its context (the
// list in Life.calls, under Life.mu), and exit ends it. Until December 2026
// each call's context watched Closing with context.AfterFunc: two
// allocations more per call, and an entry in Closing's map of children,
// under a lock that every call of the Locker shares (issue 32).
type entered[H comparable] struct {
	l          *Life[H]
	cancel     context.CancelCauseFunc
	prev, next *entered[H]
}

// exit is the done that Enter returns.
func (e *entered[H]) exit() {
	l := e.l
	l.mu.Lock()
	if e.prev != nil {
		e.prev.next = e.next
	} else if l.calls == e {
		l.calls = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	}
	e.prev, e.next = nil, nil
	l.doneLocked()
	l.mu.Unlock()
	e.cancel(context.Canceled)
}

// Why is the error of a call whose context (from Enter) may have ended: an
// error wrapping locker.ErrClosed when Close began, ContextError(ctx) when
// the caller's context ended, and err otherwise (also when err is nil).
func (l *Life[H]) Why(ctx context.Context, err error) error {
	switch {
	case ctx.Err() == nil:
		return err
	case errors.Is(context.Cause(ctx), locker.ErrClosed) && l.IsClosing():
		return locker.ErrClosed
	default:
		return ContextError(ctx)
	}
}

// Begin counts one call in progress that Enter did not admit (a Handle's
// Release, say), so that Close waits for it, and reports true; after Close
// has begun it counts nothing and reports false. Each true Begin needs one
// End.
func (l *Life[H]) Begin() bool { return l.add(false) }

// End ends a call that Begin counted.
func (l *Life[H]) End() { l.done() }

// Go runs f in a new goroutine that Close waits for (boundedly), and reports
// true; once Close has stopped waiting it runs nothing and reports false.
// A goroutine of the Locker that Close would not wait for is a leak: start
// every one through Go (or Run).
func (l *Life[H]) Go(f func()) bool {
	if !l.add(true) {
		return false
	}
	go func() {
		defer l.done()
		f()
	}()
	return true
}

// Run runs f on the caller's goroutine, counted as Go counts its goroutines,
// and reports true; once Close has stopped waiting it runs nothing and
// reports false.
func (l *Life[H]) Run(f func()) bool {
	if !l.add(true) {
		return false
	}
	defer l.done()
	f()
	return true
}

// add counts one more call (bg false: refused once Close began) or
// goroutine (bg true: refused once Close stopped waiting).
func (l *Life[H]) add(bg bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.drained || (!bg && l.closed) {
		return false
	}
	l.active++
	return true
}

func (l *Life[H]) done() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.doneLocked()
}

// doneLocked is done with l.mu held.
func (l *Life[H]) doneLocked() {
	l.active--
	if l.active < 0 {
		panic("backend: Life: more calls ended than began")
	}
	if l.active == 0 && l.idle != nil {
		close(l.idle)
		l.idle = nil
	}
}

// Hold records h as held, so that Close releases it, and reports true;
// after Close has begun it records nothing and reports false, and the
// caller must give the lock back (its Acquire fails with locker.ErrClosed).
func (l *Life[H]) Hold(h H) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.held[h] = struct{}{}
	return true
}

// Drop forgets h: it was released or lost.
func (l *Life[H]) Drop(h H) {
	l.mu.Lock()
	delete(l.held, h)
	l.mu.Unlock()
}

// Held returns the handles held now, in no particular order.
func (l *Life[H]) Held() []H {
	l.mu.Lock()
	defer l.mu.Unlock()
	hs := make([]H, 0, len(l.held))
	for h := range l.held {
		hs = append(hs, h)
	}
	return hs
}

// CloseGrace is how long Close waits, after releasing the held locks, for
// the calls and goroutines still in flight when a backend sets no Grace of
// its own.
const CloseGrace = 250 * time.Millisecond

// Closer says what a backend's Close does around the steps Life takes.
type Closer[H comparable] struct {
	// Release gives back the locks still held when Close began (their
	// handles then report locker.ErrReleasedByClose, or a loss). It must be
	// bounded; locker.ReleaseTimeout is the usual bound. May be nil.
	Release func(held []H) error
	// Grace is how long Close then waits for the calls and goroutines still
	// in flight; zero means CloseGrace.
	Grace time.Duration
	// Shutdown runs once the grace is over (or everything has ended): it
	// closes what the Locker owns, such as a client it opened from a URL.
	// May be nil.
	Shutdown func() error
	// Wait, when true, makes Close wait after Shutdown, without bound, for
	// what is still in flight: set it when Shutdown ends every request of
	// the Locker (it closed the client they run on), so that no goroutine of
	// the Locker outlives Close.
	Wait bool
}

// Close runs a Locker's Close: it refuses new calls and ends Closing (every
// call in progress gives up with locker.ErrClosed), hands the held locks to
// c.Release, waits at most c.Grace for the calls and goroutines in flight,
// ends Abandoned, runs c.Shutdown, and, with c.Wait, waits for the rest. It
// returns the errors of Release and Shutdown joined. Release is not called
// when no handle is held. A second Close waits for the first to return, then
// returns nil.
func (l *Life[H]) Close(c Closer[H]) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		<-l.closeDone
		return nil
	}
	defer close(l.closeDone)
	l.closed = true
	held := make([]H, 0, len(l.held))
	for h := range l.held {
		held = append(held, h)
	}
	clear(l.held)
	var calls []context.CancelCauseFunc
	for e := l.calls; e != nil; e = e.next {
		calls = append(calls, e.cancel)
	}
	l.mu.Unlock()

	l.closeNow(locker.ErrClosed)
	for _, cancel := range calls {
		cancel(locker.ErrClosed)
	}
	var err error
	if c.Release != nil && len(held) > 0 {
		err = c.Release(held)
	}
	grace := c.Grace
	if grace <= 0 {
		grace = CloseGrace
	}
	l.wait(grace)
	l.abandon(locker.ErrClosed)
	if c.Shutdown != nil {
		err = errors.Join(err, c.Shutdown())
	}
	if c.Wait {
		l.wait(-1)
	}
	l.mu.Lock()
	l.drained = true
	l.mu.Unlock()
	return err
}

// Active is the number of calls and goroutines in progress: for tests, and
// for a backend's own accounting.
func (l *Life[H]) Active() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.active
}

// wait waits until nothing is active, or at most d (forever when d < 0),
// and reports whether nothing is active.
func (l *Life[H]) wait(d time.Duration) bool {
	l.mu.Lock()
	if l.active == 0 {
		l.mu.Unlock()
		return true
	}
	if l.idle == nil {
		l.idle = make(chan struct{})
	}
	idle := l.idle
	l.mu.Unlock()
	if d < 0 {
		<-idle
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-idle:
		return true
	case <-t.C:
		return false
	}
}

// AsHandle returns h as a locker.Handle, or a nil interface when err is not
// nil: a backend's Acquire returns AsHandle(l.acquire(...)) so that a failed
// call never returns a typed nil pointer that compares unequal to nil.
func AsHandle[H locker.Handle](h H, err error) (locker.Handle, error) {
	if err != nil {
		return nil, err
	}
	return h, nil
}
