package redis

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-locker/locker"
)

// Every request to Redis runs on a goroutine of its own, and its caller waits
// for it only as long as the caller's context and the Locker allow.
//
// go-redis cannot abort a request in flight on a cancel. With
// ContextTimeoutEnabled it turns a context's deadline into a socket deadline
// when the request starts, so a later cancel() without a deadline, or the
// Locker's Close, leaves the read blocked until the client's ReadTimeout
// (forever with ReadTimeout: -1); without ContextTimeoutEnabled it ignores
// contexts during socket I/O altogether. So the caller stops waiting instead,
// and the abandoned request finishes in the background: its context is
// cancelled (go-redis gives up at its next check: a pool wait, a dial, a
// retry), and a blocked read ends at the socket deadline (the ReadTimeout,
// see also requestTimeout). Its effect on the server is unknown, so the
// caller says what to undo once it has finished (abandoned).
//
// The hand-off costs about a microsecond and a few allocations per request
// in-process, and more where waking another OS thread is slow (a small VM):
// see BENCHMARKS.md. It is the price of calls that always honour their
// context and Close.

// requestTimeout bounds the requests of a Locker whose client has no
// ReadTimeout (-1) when the caller's context has no earlier deadline: the
// scripts never block on the server, so a request without a reply for this
// long is stuck on a dead connection, and an abandoned request does not keep
// its goroutine and connection longer than this. (With ContextTimeoutEnabled
// the deadline reaches the socket; without it, nothing but the ReadTimeout
// does, and the goroutine of an abandoned request lives until the client is
// closed.) Other clients' ReadTimeout bounds every socket read already.
const requestTimeout = 30 * time.Second

// errNoReply ends a call whose request got no reply within requestTimeout. It
// wraps os.ErrDeadlineExceeded, as the timeout of a go-redis socket read does.
var errNoReply = fmt.Errorf("redis: no reply within %v, the request was abandoned: %w", requestTimeout, os.ErrDeadlineExceeded)

// exec runs a Redis call so that it returns as soon as ctx ends (an error
// wrapping ctx.Err()) or the Locker closes (locker.ErrClosed), whatever the
// client does with contexts. abandoned, if not nil, runs once a call cut
// short that way has finished, since its effect on the server is unknown.
// exec must run inside an active call (see enter) or an active goroutine.
func (l *Locker) exec(ctx context.Context, call func(context.Context) error, abandoned func()) error {
	return l.detach(ctx, l.ctx, call, abandoned)
}

// detach is exec with life in place of the Locker's own context: the call
// also ends, with locker.ErrClosed, when life ends. Close releases the locks
// it holds with a life of its own, since the Locker's has ended by then.
func (l *Locker) detach(ctx, life context.Context, call func(context.Context) error, abandoned func()) error {
	if ctx.Err() != nil {
		return ctxErr(ctx)
	}
	if life.Err() != nil {
		return locker.ErrClosed
	}
	// The request's context: cancelled when the caller stops waiting, so
	// that go-redis gives up at its next check; bounded where nothing else
	// bounds a socket read.
	var (
		rctx   context.Context
		cancel context.CancelFunc
	)
	if d, ok := ctx.Deadline(); !l.unbounded || ok && time.Until(d) <= requestTimeout {
		rctx, cancel = context.WithCancel(ctx)
	} else {
		rctx, cancel = context.WithTimeout(ctx, requestTimeout)
	}
	r := &request{done: make(chan error, 1)}
	l.active.add()
	go func() {
		defer l.active.done()
		err := call(rctx)
		r.mu.Lock()
		if !r.gone {
			r.done <- err
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		if abandoned != nil {
			abandoned()
		}
	}()
	select {
	case err := <-r.done:
		return r.finished(err, ctx, life, rctx, cancel, abandoned)
	case <-rctx.Done():
	case <-life.Done():
	}
	r.mu.Lock()
	select {
	case err := <-r.done: // finished meanwhile: its result stands
		r.mu.Unlock()
		return r.finished(err, ctx, life, rctx, cancel, abandoned)
	default:
		r.gone = true
		r.mu.Unlock()
		cancel()
		return ended(ctx, life)
	}
}

// request is one call of detach in flight.
type request struct {
	done chan error // its result, unless the caller is gone
	mu   sync.Mutex
	gone bool // the caller stopped waiting; guarded by mu with done
}

// finished judges a call that returned before the caller gave up. An error
// caused by the end of the request's context (go-redis checked it before or
// between its socket operations) leaves its effect unknown, as when the
// caller gives up first.
func (r *request) finished(err error, ctx, life, rctx context.Context, cancel context.CancelFunc, abandoned func()) error {
	cut := err != nil && rctx.Err() != nil
	cancel()
	if !cut {
		return err
	}
	if abandoned != nil {
		abandoned()
	}
	return ended(ctx, life)
}

// ended is why the caller stopped waiting for a request.
func ended(ctx, life context.Context) error {
	switch {
	case ctx.Err() != nil:
		return ctxErr(ctx)
	case life.Err() != nil:
		return locker.ErrClosed
	default:
		return errNoReply
	}
}

// ctxErr is the error of an ended ctx: it wraps ctx.Err(), so errors.Is
// with context.Canceled or context.DeadlineExceeded holds, and the cause
// given to context.WithCancelCause, if any.
func ctxErr(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// enter counts a call that may talk to Redis as active, unless the Locker
// is closed; exit ends it. Close waits (boundedly, see closeGrace) until
// nothing is active.
func (l *Locker) enter() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.active.add()
	return true
}

func (l *Locker) exit() { l.active.done() }

// run runs f as an active call, unless the Locker is closed (then f does
// not run and run returns false: Close ends the handles itself). It is the
// Go hook of the lease keeper.
func (l *Locker) run(f func()) bool {
	if !l.enter() {
		return false
	}
	defer l.exit()
	f()
	return true
}

// tracker counts active calls and goroutines; wait returns once none is.
// Unlike sync.WaitGroup it allows add while someone waits, which happens
// when an active goroutine starts another.
type tracker struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0 while someone waits
}

func (t *tracker) add() {
	t.mu.Lock()
	t.n++
	t.mu.Unlock()
}

func (t *tracker) done() {
	t.mu.Lock()
	t.n--
	if t.n == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
	t.mu.Unlock()
}

// wait waits until nothing is active, or at most d (forever when d < 0). It
// reports whether nothing is active.
func (t *tracker) wait(d time.Duration) bool {
	t.mu.Lock()
	if t.n == 0 {
		t.mu.Unlock()
		return true
	}
	if t.idle == nil {
		t.idle = make(chan struct{})
	}
	idle := t.idle
	t.mu.Unlock()
	if d < 0 {
		<-idle
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-idle:
		return true
	case <-timer.C:
		return false
	}
}
