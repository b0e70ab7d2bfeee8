package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
)

// A caller waits for a request to Redis only as long as its context and the
// Locker allow.
//
// go-redis cannot abort a request in flight on a cancel. With
// ContextTimeoutEnabled it turns a context's deadline into a socket deadline
// when the request starts, so a later cancel() without a deadline, or the
// Locker's Close, leaves the read blocked until that deadline or the
// client's ReadTimeout (forever with ReadTimeout: -1); without
// ContextTimeoutEnabled it ignores contexts during socket I/O altogether.
//
// So a request first runs on the caller's goroutine with a socket deadline
// at most inlineWait away (see inline): a prompt reply, the common case,
// costs no hand-off between goroutines (on a small, busy machine waking
// another thread costs tens of microseconds per request, as much as the
// round trip itself; see BENCHMARKS.md). On a client with
// ContextTimeoutEnabled that socket deadline comes from the context; on a
// *goredis.Client without it, inline requests go through a clone of the
// client made by its WithTimeout when the Locker is made (the same pool,
// and the hooks added to the client before then; a timeout of inlineWait,
// or the client's ReadTimeout when shorter). Either way go-redis's other
// waits (a pooled connection, a dial, a retry) end with the request's
// context, which ends when the caller's does or the Locker closes.
//
// A request that gets no reply in that time, and every request of a
// *goredis.ClusterClient without ContextTimeoutEnabled (which has no such
// clone) or of a client type the Locker does not know, runs on a goroutine
// of its own (one that ran an earlier request, when one is idle: see
// backend.Life.Reuse), and the caller stops waiting when
// ctx ends or the Locker closes; the abandoned request finishes in the
// background: its context is cancelled (go-redis gives up at its next
// check: a pool wait, a dial, a retry), and a blocked read ends at the
// socket deadline (the ReadTimeout, see also requestTimeout). Its effect on
// the server is unknown, so the caller says what to undo once it has
// finished (abandoned). So a cancel or a Close takes effect within about
// inlineWait.

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
	return l.detach(ctx, l.life.Closing(), call, abandoned, inlineWatch)
}

// execEntered is exec for a ctx that ends when the Locker's Close begins
// (one from Life.Enter, or made from one): a request that runs inline need
// not watch Close itself (see inline).
func (l *Locker) execEntered(ctx context.Context, call func(context.Context) error, abandoned func()) error {
	return l.detach(ctx, l.life.Closing(), call, abandoned, inlineEntered)
}

// How detach may run a request: inline, watching life (inlineWatch) or
// not, since ctx ends with it (inlineEntered); or never inline (noInline).
const (
	noInline = iota
	inlineWatch
	inlineEntered
)

// execBackground is exec for requests nobody waits on with a user's latency
// at stake (renewals): always off the caller's goroutine, never inline, so
// that a slow link costs them no timed-out attempt and no connection (see
// inline).
func (l *Locker) execBackground(ctx context.Context, call func(context.Context) error) error {
	return l.detach(ctx, l.life.Closing(), call, nil, noInline)
}

// detach is exec with life in place of the Locker's Closing context: the
// call also ends, with locker.ErrClosed, when life ends. Close releases the
// locks it holds with a life of its own, since Closing has ended by then.
func (l *Locker) detach(ctx, life context.Context, call func(context.Context) error, abandoned func(), how int) error {
	if ctx.Err() != nil {
		return l.life.Why(ctx, nil)
	}
	if life.Err() != nil {
		return locker.ErrClosed
	}
	if how != noInline && l.inlineOK(ctx) {
		err, done := l.inline(ctx, life, how == inlineWatch, call, abandoned)
		if done {
			return err
		}
		// No reply within inlineWait: wait on, off the caller's goroutine.
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
	if !l.life.Reuse(func() {
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
	}) {
		cancel()
		return locker.ErrClosed // Close has stopped waiting for requests
	}
	select {
	case err := <-r.done:
		return l.finished(r, err, ctx, life, rctx, cancel, abandoned)
	case <-rctx.Done():
	case <-life.Done():
	}
	r.mu.Lock()
	select {
	case err := <-r.done: // finished meanwhile: its result stands
		r.mu.Unlock()
		return l.finished(r, err, ctx, life, rctx, cancel, abandoned)
	default:
		r.gone = true
		r.mu.Unlock()
		cancel()
		return l.ended(ctx, life)
	}
}

// inlineWait bounds how long a request runs on the caller's goroutine (see
// inline) before the caller hands it to a goroutine of its own, so that a
// context cancelled or a Close while the server does not answer takes effect
// within about this long: a socket read on the caller's goroutine ends at
// most this long after it started, and every other wait of go-redis (a
// pooled connection, a dial, a retry's back-off) ends with the request's
// context (see inline). A healthy Redis answers in well under a
// millisecond.
const inlineWait = 150 * time.Millisecond

// inlineOK reports whether a request may run on the caller's goroutine: a
// request can be bounded without a goroutine (the client turns a context's
// deadline into the socket deadline, or a clone of it has a short socket
// timeout, min(ReadTimeout, inlineWait); see inliner), no request lately
// came close to inlineWait (a slow
// link: see inline), and, for the clone, whose socket deadline ignores the
// context, ctx's deadline is not nearer than inlineWait.
func (l *Locker) inlineOK(ctx context.Context) bool {
	if l.inliner == nil || time.Now().UnixNano() < l.slowUntil.Load() {
		return false
	}
	if !l.deadlines {
		if d, ok := ctx.Deadline(); ok && time.Until(d) < inlineWait {
			return false
		}
	}
	return true
}

// inlineTimeout is the socket timeout of the inline clone of a client
// without ContextTimeoutEnabled whose ReadTimeout is rt: inlineWait, or rt
// when that is shorter.
func inlineTimeout(rt time.Duration) time.Duration {
	if rt > 0 && rt < inlineWait {
		return rt
	}
	return inlineWait
}

// via is the client a request with context ctx goes through: the inline
// clone when it runs inline (ctx is then a boundCtx), else the Locker's.
func (l *Locker) via(ctx context.Context) goredis.UniversalClient {
	if _, ok := ctx.(boundCtx); ok {
		return l.inliner
	}
	return l.client
}

// slowPause is how long requests skip inline after one took longer than
// half of inlineWait: on a slow link (a distant server, a proxy adding
// latency) every inline attempt would time out and cost its connection.
const slowPause = 10 * time.Second

// inline runs call on the caller's goroutine with a socket deadline of at
// most inlineWait: the common case, a prompt reply, then costs no goroutine
// and no hand-off between threads (on a small machine the hand-off is most
// of the client's cost; see BENCHMARKS.md). It reports done=false when the
// bound passed with no reply while ctx and life still allow more: the
// caller then runs call again off its goroutine. That is safe because every
// call exec runs is idempotent for its owner token — acquiring finds the
// lock already the owner's and returns its token, releasing finds the
// release record, extending extends again — and go-redis may retry a
// request by itself anyway. A request that takes more than half of
// inlineWait turns inline off for slowPause, so that a slow link does not
// lose a connection to every timed-out attempt.
//
// The request's context is one allocation and one timer where it can be: a
// ctx that ends with life already (watch false: execEntered) is not made
// to watch life too, and on a client that sets the socket deadline from the
// context (ContextTimeoutEnabled) the deadline context itself goes to
// go-redis, as the clone that via picks by boundCtx is that client.
func (l *Locker) inline(ctx, life context.Context, watch bool, call func(context.Context) error, abandoned func()) (err error, done bool) {
	start := time.Now()
	bound := start.Add(inlineWait)
	if d, ok := ctx.Deadline(); ok && d.Before(bound) {
		bound = d
	}
	// The bound reaches the socket (the context's deadline with
	// ContextTimeoutEnabled, the clone's timeout without it), but go-redis
	// waits for a pooled connection, for a dial and between its retries (it
	// retries a read that timed out, each time on another connection, and
	// drops the one that timed out) on the context's Done channel only. So
	// the request's context ends at the bound, when ctx does, or when life
	// does (Close): those waits end then too, and a stalled server costs a
	// request one connection, not one per retry.
	rctx, cancel := context.WithDeadline(ctx, bound)
	var stop func() bool
	if watch {
		stop = context.AfterFunc(life, cancel)
	}
	if l.deadlines {
		err = call(rctx)
	} else {
		err = call(boundCtx{rctx, bound})
	}
	if stop != nil {
		stop()
	}
	cancel()
	if took := time.Since(start); took > inlineWait/2 {
		l.slowUntil.Store(time.Now().Add(slowPause).UnixNano())
	}
	switch {
	case err == nil:
		return nil, true
	case ctx.Err() != nil || life.Err() != nil || isTimeout(err) && deadlinePassed(ctx):
		// Cut short: its effect on the server is unknown.
		if abandoned != nil {
			abandoned()
		}
		return l.ended(ctx, life), true
	case isTimeout(err) && !time.Now().Before(bound):
		return nil, false
	}
	return err, true
}

// boundCtx marks the context of a request that runs inline (see via); its
// deadline is the inline bound.
type boundCtx struct {
	context.Context
	deadline time.Time
}

func (c boundCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// deadlinePassed reports whether ctx's deadline has passed, even if ctx's
// timer has not yet ended it.
func deadlinePassed(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
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
func (l *Locker) finished(r *request, err error, ctx, life, rctx context.Context, cancel context.CancelFunc, abandoned func()) error {
	// A socket deadline set to ctx's deadline can fire a moment before
	// ctx's own timer: that timeout is ctx's too.
	cut := err != nil && (rctx.Err() != nil || isTimeout(err) && deadlinePassed(ctx))
	cancel()
	if !cut {
		return err
	}
	if abandoned != nil {
		abandoned()
	}
	return l.ended(ctx, life)
}

// ended is why the caller stopped waiting for a request: Life.Why of ctx
// (the cause kept; locker.ErrClosed when Close ended the call's context),
// locker.ErrClosed when life ended, or errNoReply.
func (l *Locker) ended(ctx, life context.Context) error {
	switch {
	case ctx.Err() != nil:
		return l.life.Why(ctx, nil)
	case deadlinePassed(ctx):
		// Its timer fires at once: wait for it, so that the error keeps
		// the context's cause (context.WithDeadlineCause).
		<-ctx.Done()
		return l.life.Why(ctx, nil)
	case life.Err() != nil:
		return locker.ErrClosed
	default:
		return errNoReply
	}
}

// enter counts a call that Life.Enter did not admit (a Handle's Release,
// a loss report), unless Close has begun; exit ends it. Close waits
// (boundedly, see closeGrace) until nothing is active.
func (l *Locker) enter() bool { return l.life.Begin() }

func (l *Locker) exit() { l.life.End() }

// run runs f as an active call, unless Close has begun (then f does not
// run and run returns false: Close ends the handles itself). It is the Go
// hook of the lease keeper.
func (l *Locker) run(f func()) bool { return l.life.Call(f) }
