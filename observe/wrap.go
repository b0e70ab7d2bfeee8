package observe

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/go-locker/locker"
)

// Wrap returns a Locker that takes its locks through l and records them
// (see the package doc). It has exactly the optional interfaces l has, of
// locker.Inspector, locker.Semaphorer and locker.ReadWriter. Its Close
// closes l.
func Wrap(l locker.Locker, opts ...Option) locker.Locker {
	w := &wrapped{
		inner:   l,
		rec:     newRecorder(newConfig(l, opts)),
		local:   map[localKey]*localCount{},
		pending: map[*handle]struct{}{},
		closing: make(chan struct{}),
	}
	in, isIn := l.(locker.Inspector)
	sem, isSem := l.(locker.Semaphorer)
	rw, isRW := l.(locker.ReadWriter)
	i, s, r := inspectorOf{in: in, w: w}, semaphorerOf{sem: sem, w: w}, readWriterOf{rw: rw, w: w}
	// One type for each combination, so that a type assertion on the
	// wrapped Locker finds exactly what l has.
	switch {
	case isIn && isSem && isRW:
		return &struct {
			*wrapped
			inspectorOf
			semaphorerOf
			readWriterOf
		}{w, i, s, r}
	case isIn && isSem:
		return &struct {
			*wrapped
			inspectorOf
			semaphorerOf
		}{w, i, s}
	case isIn && isRW:
		return &struct {
			*wrapped
			inspectorOf
			readWriterOf
		}{w, i, r}
	case isSem && isRW:
		return &struct {
			*wrapped
			semaphorerOf
			readWriterOf
		}{w, s, r}
	case isIn:
		return &struct {
			*wrapped
			inspectorOf
		}{w, i}
	case isSem:
		return &struct {
			*wrapped
			semaphorerOf
		}{w, s}
	case isRW:
		return &struct {
			*wrapped
			readWriterOf
		}{w, r}
	}
	return w
}

// wrapped is the Locker that Wrap returns, less the optional interfaces.
type wrapped struct {
	inner locker.Locker
	rec   *recorder

	mu     sync.Mutex
	local  map[localKey]*localCount // the locks held through this Locker, by key
	closed bool                     // Close has returned from the inner Close
	// pending are the locks held with no watcher yet (see watchAfter);
	// sweeping, whether the sweeper runs.
	pending  map[*handle]struct{}
	sweeping bool

	closing   chan struct{} // closed once the inner Close has returned
	closeOnce sync.Once
	watchers  sync.WaitGroup // one per handle whose end is not recorded yet
}

// Unwrap returns the wrapped Locker.
func (w *wrapped) Unwrap() locker.Locker { return w.inner }

func (w *wrapped) Acquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return w.acquire(ctx, famMutex, opAcquire, key, 0, func(ctx context.Context) (locker.Handle, error) {
		return w.inner.Acquire(ctx, key, opts...)
	})
}

func (w *wrapped) TryAcquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return w.acquire(ctx, famMutex, opTry, key, 0, func(ctx context.Context) (locker.Handle, error) {
		return w.inner.TryAcquire(ctx, key, opts...)
	})
}

// Close closes the wrapped Locker, then records the end of the locks it
// ended, and returns when every lock taken through w has been accounted
// for.
func (w *wrapped) Close() error {
	err := w.inner.Close()
	w.closeOnce.Do(func() {
		w.mu.Lock()
		w.closed = true
		w.mu.Unlock()
		close(w.closing)
	})
	w.watchers.Wait()
	return err
}

// acquire runs call, an acquisition of key in family f, and records it.
// n is a semaphore's limit.
func (w *wrapped) acquire(ctx context.Context, f family, op int, key string, n int, call func(context.Context) (locker.Handle, error)) (locker.Handle, error) {
	r := w.rec
	lk := localKey{space: spaceOf(f), key: key}
	waited := false
	var holder trace.Link // the lock waited for: its Acquire span and token
	if op == opAcquire {
		waited, holder = w.heldLocally(f, lk, n)
	}
	startOpts := r.spanStart[f]
	if holder.SpanContext.IsValid() {
		startOpts = append(slices.Clip(startOpts), trace.WithLinks(holder))
	}
	ctx, span := r.tracer.Start(ctx, r.spanName[f][op], startOpts...)
	if span.IsRecording() {
		if kv, ok := r.keyAttr(key); ok {
			span.SetAttributes(kv)
		}
		if f == famSemaphore {
			span.SetAttributes(attrLimit.Int(n))
		}
	}
	if op == opAcquire {
		r.waiting.Add(ctx, 1, r.family[f]...)
	}
	start := time.Now()
	h, err := call(ctx)
	now := time.Now()
	d := now.Sub(start).Seconds()
	if op == opAcquire {
		r.waiting.Add(ctx, -1, r.family[f]...)
	}
	out := acquireOutcomeOf(ctx, err)
	r.acquireDur.Record(ctx, d, r.acquire[f][op][out]...)
	if waited {
		r.waitDur.Record(ctx, d, r.wait[f][out]...)
	}
	if span.IsRecording() {
		span.SetAttributes(attrOutcome.String(acquireOutcomeNames[out]))
		if err == nil {
			span.SetAttributes(attrToken.Int64(h.Token()))
		} else if out == acqError {
			span.SetStatus(codes.Error, r.errText(err))
		}
	}
	span.End()
	if err != nil {
		return nil, err
	}
	return w.hold(h, f, lk, now, span.SpanContext()).public(), nil
}

// watchAfter is how long a lock is held before a goroutine starts to
// watch it for its end: most locks are released sooner, and their Release
// records their end in the caller's goroutine. One sweeper goroutine per
// wrapped Locker, running only while locks are held, starts the watchers
// every watchAfter; a goroutine or a timer per lock cost 6-10% of an
// uncontended Redis cycle on a loaded two-core machine (a new timer wakes
// the network poller). A loss within watchAfter is recorded when its watch
// begins, at most 2 × watchAfter late.
const watchAfter = 10 * time.Millisecond

// hold wraps h, just acquired at start by the span sc, counts it held and
// arranges for its end to be recorded.
func (w *wrapped) hold(h locker.Handle, f family, lk localKey, start time.Time, sc trace.SpanContext) *handle {
	wh := &handle{inner: h, w: w, f: f, lk: lk, start: start, sc: sc}
	w.rec.held.Add(context.Background(), 1, w.rec.family[f]...)
	w.mu.Lock()
	c := w.local[lk]
	if c == nil {
		c = &localCount{}
		w.local[lk] = c
	}
	c.add(f, 1)
	c.last = wh
	closed := w.closed
	startSweeper := false
	if !closed {
		w.watchers.Add(1) // done when its end is recorded, or its watcher returns
		w.pending[wh] = struct{}{}
		if !w.sweeping {
			w.sweeping, startSweeper = true, true
			w.watchers.Add(1)
		}
	}
	w.mu.Unlock()
	if closed {
		// Acquired as Close returned: nothing will watch it.
		w.ended(wh)
		return wh
	}
	if startSweeper {
		go w.sweep()
	}
	return wh
}

// sweep starts a watcher for each lock held longer than watchAfter, every
// watchAfter, and for every lock once w is closed; it returns when no lock
// is pending.
func (w *wrapped) sweep() {
	defer w.watchers.Done()
	t := time.NewTimer(watchAfter)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-w.closing:
		}
		w.mu.Lock()
		now := time.Now()
		for h := range w.pending {
			if w.closed || now.Sub(h.start) >= watchAfter {
				delete(w.pending, h)
				go w.watch(h)
			}
		}
		if len(w.pending) == 0 {
			w.sweeping = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		t.Reset(watchAfter)
	}
}

// watch records h's end once its lock ends, or once w is closed (the
// wrapped Close has ended every lock it could).
//
// While it watches, it follows the lock's locker.AtRisker, if it has one,
// in the locker.at_risk count.
func (w *wrapped) watch(h *handle) {
	defer w.watchers.Done()
	r, _ := h.inner.(locker.AtRisker)
	risky := false
	count := func(at bool) {
		if at != risky {
			risky = at
			d := int64(-1)
			if at {
				d = 1
			}
			w.rec.atRisk.Add(context.Background(), d, w.rec.family[h.f]...)
		}
	}
	for {
		var changed <-chan struct{}
		if r != nil {
			var at bool
			at, changed = r.AtRisk()
			count(at)
		}
		select {
		case <-h.inner.Done():
		case <-w.closing:
		case <-changed:
			continue
		}
		break
	}
	count(false)
	w.ended(h)
}

// released records the end of h's lock, which its Release ended, unless
// a watcher did already.
func (w *wrapped) released(h *handle) {
	w.mu.Lock()
	_, pending := w.pending[h]
	if pending {
		delete(w.pending, h)
	}
	w.mu.Unlock()
	w.ended(h)
	if pending {
		w.watchers.Done()
	}
}

// ended records the end of h's lock, the first time only.
func (w *wrapped) ended(h *handle) {
	if !h.recorded.CompareAndSwap(false, true) {
		return
	}
	r, f := w.rec, h.f
	e := endOf(h.inner.Err())
	ctx := context.Background()
	r.held.Add(ctx, -1, r.family[f]...)
	r.holdDur.Record(ctx, time.Since(h.start).Seconds(), r.hold[f][e]...)
	if e != endReleased {
		r.losses.Add(ctx, 1, r.loss[f][e]...)
	}
	w.mu.Lock()
	if c := w.local[h.lk]; c != nil {
		c.add(f, -1)
		if c.last == h {
			c.last = nil
		}
		if c.zero() {
			delete(w.local, h.lk)
		}
	}
	w.mu.Unlock()
}

// heldLocally reports whether an acquisition of lk in family f (n: a
// semaphore's limit) would wait for a lock held through w, and if so the
// span link to the latest acquisition of lk still held (see the package
// doc), if its span was recorded.
func (w *wrapped) heldLocally(f family, lk localKey, n int) (bool, trace.Link) {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.local[lk]
	if c == nil {
		return false, trace.Link{}
	}
	var held bool
	switch f {
	case famRead:
		held = c.writers > 0
	case famWrite:
		held = c.readers+c.writers > 0
	case famSemaphore:
		held = c.holders >= max(n, 1)
	default:
		held = c.holders > 0
	}
	if !held || c.last == nil || !c.last.sc.IsValid() {
		return held, trace.Link{}
	}
	return true, trace.Link{SpanContext: c.last.sc, Attributes: []attribute.KeyValue{attrToken.Int64(c.last.inner.Token())}}
}

// localKey is a key in a family's keyspace: the mutex, the reader-writer
// locks (read and write share one), the semaphores.
type localKey struct {
	space family
	key   string
}

func spaceOf(f family) family {
	if f == famWrite {
		return famRead
	}
	return f
}

// localCount counts the locks of one localKey held through a wrapped
// Locker; last is the latest of them, while it is held.
type localCount struct {
	holders, readers, writers int
	last                      *handle
}

func (c *localCount) add(f family, d int) {
	switch f {
	case famRead:
		c.readers += d
	case famWrite:
		c.writers += d
	default:
		c.holders += d
	}
}

func (c *localCount) zero() bool { return c.holders == 0 && c.readers == 0 && c.writers == 0 }

// handle is a Handle taken through a wrapped Locker: the wrapped Handle's
// key, token, TTL, Done and Err, and a Release that is recorded.
type handle struct {
	inner locker.Handle
	w     *wrapped
	f     family
	lk    localKey
	start time.Time
	sc    trace.SpanContext // its Acquire span's
	// recorded is set by whoever records the lock's end: Release, in the
	// caller's goroutine (so that Release waits for no other goroutine),
	// or the watcher.
	recorded atomic.Bool
}

func (h *handle) Key() string           { return h.inner.Key() }
func (h *handle) Token() int64          { return h.inner.Token() }
func (h *handle) Done() <-chan struct{} { return h.inner.Done() }
func (h *handle) Err() error            { return h.inner.Err() }
func (h *handle) TTL() time.Duration    { return h.inner.TTL() }

// Unwrap returns the wrapped Handle.
func (h *handle) Unwrap() locker.Handle { return h.inner }

// public is h as the caller gets it: with the wrapped Handle's
// locker.AtRisker when it has one, else without.
func (h *handle) public() locker.Handle {
	if _, ok := h.inner.(locker.AtRisker); ok {
		return atRiskHandle{h} // one pointer: no allocation
	}
	return h
}

// atRiskHandle is a handle whose wrapped Handle is a locker.AtRisker.
type atRiskHandle struct{ *handle }

// AtRisk is the wrapped Handle's.
func (h atRiskHandle) AtRisk() (bool, <-chan struct{}) {
	return h.inner.(locker.AtRisker).AtRisk()
}

// Release releases the wrapped Handle and records the Release and, before
// it returns, the lock's end.
func (h *handle) Release(ctx context.Context) error {
	r, f := h.w.rec, h.f
	ctx, span := r.tracer.Start(ctx, "locker.Release", r.spanStart[f]...)
	if span.IsRecording() {
		if kv, ok := r.keyAttr(h.inner.Key()); ok {
			span.SetAttributes(kv)
		}
		span.SetAttributes(attrToken.Int64(h.inner.Token()))
	}
	err := h.inner.Release(ctx)
	select {
	case <-h.inner.Done(): // as Release promises
		h.w.released(h)
	default: // a backend that broke its promise: the watcher records the end
	}
	out := releaseOutcomeOf(ctx, err)
	r.releases.Add(ctx, 1, r.release[f][out]...)
	if span.IsRecording() {
		span.SetAttributes(attrOutcome.String(releaseOutcomeNames[out]))
		if out == relError {
			span.SetStatus(codes.Error, r.errText(err))
		}
	}
	span.End()
	return err
}

// inspectorOf gives a wrapped Locker the Inspect of a wrapped Inspector.
type inspectorOf struct {
	in locker.Inspector
	w  *wrapped
}

func (x inspectorOf) Inspect(ctx context.Context, key string) (locker.LockInfo, error) {
	r := x.w.rec
	ctx, span := r.tracer.Start(ctx, "locker.Inspect", r.spanStart[famMutex]...)
	if span.IsRecording() {
		if kv, ok := r.keyAttr(key); ok {
			span.SetAttributes(kv)
		}
	}
	info, err := x.in.Inspect(ctx, key)
	if err != nil {
		span.SetStatus(codes.Error, r.errText(err))
	} else if span.IsRecording() && info.Held {
		span.SetAttributes(attrToken.Int64(info.Token))
	}
	span.End()
	return info, err
}

// semaphorerOf gives a wrapped Locker the semaphores of a wrapped
// Semaphorer.
type semaphorerOf struct {
	sem locker.Semaphorer
	w   *wrapped
}

func (x semaphorerOf) AcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	return x.w.acquire(ctx, famSemaphore, opAcquire, key, n, func(ctx context.Context) (locker.Handle, error) {
		return x.sem.AcquireSemaphore(ctx, key, n, opts...)
	})
}

func (x semaphorerOf) TryAcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	return x.w.acquire(ctx, famSemaphore, opTry, key, n, func(ctx context.Context) (locker.Handle, error) {
		return x.sem.TryAcquireSemaphore(ctx, key, n, opts...)
	})
}

// readWriterOf gives a wrapped Locker the reader-writer locks of a wrapped
// ReadWriter.
type readWriterOf struct {
	rw locker.ReadWriter
	w  *wrapped
}

func (x readWriterOf) AcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return x.w.acquire(ctx, famRead, opAcquire, key, 0, func(ctx context.Context) (locker.Handle, error) {
		return x.rw.AcquireRead(ctx, key, opts...)
	})
}

func (x readWriterOf) TryAcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return x.w.acquire(ctx, famRead, opTry, key, 0, func(ctx context.Context) (locker.Handle, error) {
		return x.rw.TryAcquireRead(ctx, key, opts...)
	})
}

func (x readWriterOf) AcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return x.w.acquire(ctx, famWrite, opAcquire, key, 0, func(ctx context.Context) (locker.Handle, error) {
		return x.rw.AcquireWrite(ctx, key, opts...)
	})
}

func (x readWriterOf) TryAcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return x.w.acquire(ctx, famWrite, opTry, key, 0, func(ctx context.Context) (locker.Handle, error) {
		return x.rw.TryAcquireWrite(ctx, key, opts...)
	})
}

// acquireOutcomeOf classifies the error of an acquisition under ctx.
func acquireOutcomeOf(ctx context.Context, err error) acquireOutcome {
	switch {
	case err == nil:
		return acqAcquired
	case errors.Is(err, locker.ErrNotAcquired):
		return acqNotAcquired
	case errors.Is(err, locker.ErrClosed):
		return acqClosed
	case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return acqCtxEnded
	}
	return acqError
}

// releaseOutcomeOf classifies the error of a Release under ctx.
func releaseOutcomeOf(ctx context.Context, err error) releaseOutcome {
	switch {
	case err == nil:
		return relReleased
	case errors.Is(err, locker.ErrLost):
		return relLost
	case errors.Is(err, locker.ErrClosed):
		return relClosed
	case errors.Is(err, locker.ErrReleased):
		return relAlreadyReleased
	case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return relCtxEnded
	}
	return relError
}

// endOf classifies how a lock whose Handle's Err is err ended.
func endOf(err error) end {
	switch {
	case err == nil:
		return endOther // not ended: its Locker's Close returned without ending it
	case errors.Is(err, locker.ErrLost):
		return endLost
	case errors.Is(err, locker.ErrClosed):
		return endClosed
	case errors.Is(err, locker.ErrReleased):
		return endReleased
	}
	return endOther
}

// hashKey is the key's locker.key.hash: the first 16 hex digits of its
// SHA-256.
func hashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}
