package sqltable

import (
	"context"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/backoff"
	"github.com/go-locker/locker/internal/lease"
)

// Acquire and TryAcquire: one try, then (Acquire) the wait for the key,
// woken by procHub and the Locker's waker (see hub.go).

// testHookKeep, when set (by tests), runs in acquire between the
// registration of a new Handle and the check that Close has not begun.
var testHookKeep func(*Handle)

// TryAcquire makes one attempt to take key. When another holder has it the
// error wraps locker.ErrNotAcquired.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "try-acquire", key, opts, false))
}

// Acquire takes key, waiting as long as ctx allows while another holder has
// it (see "Waiting" in the package documentation).
func (l *Locker) Acquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "acquire", key, opts, true))
}

func (l *Locker) acquire(ctx context.Context, op, key string, opts []locker.Option, wait bool) (*Handle, error) {
	cctx, done, err := l.life.Enter(ctx, op, key)
	if err != nil {
		return nil, err
	}
	defer done()
	ttl, err := l.cfg.lockTTL(opts)
	if err != nil {
		return nil, backend.KeyError(op, key, err)
	}
	drift, err := l.cfg.driftFor(ttl)
	if err != nil {
		return nil, backend.KeyError(op, key, err)
	}
	if err := l.init(cctx); err != nil {
		return nil, backend.KeyError(op, key, l.life.Why(cctx, err))
	}
	desc := backend.Owner(opts)
	if wait && l.queued && procHub.queued(l.hubKey, key) {
		// Waiters of this process are queued for key: this caller would
		// only fail its try behind them (and on PostgreSQL hold up their
		// next try with the row lock it takes), so it queues at once.
		h, err := l.await(cctx, key, ttl, drift, desc)
		return l.keep(cctx, op, key, h, err)
	}
	h, err := l.try(cctx, key, ttl, drift, desc, noSeq)
	for n := 1; lease.IsLate(err) && !wait && n < lease.LateTries; n++ {
		h, err = l.try(cctx, key, ttl, drift, desc, noSeq)
	}
	switch {
	case (err != nil && !(wait && lease.IsLate(err))) || h != nil:
		// try's outcome stands (a late grant is waited past by Acquire).
	case !wait:
		return nil, backend.KeyError(op, key, locker.ErrNotAcquired)
	default:
		h, err = l.await(cctx, key, ttl, drift, desc)
	}
	return l.keep(cctx, op, key, h, err)
}

// await waits for key until ctx ends, trying again whenever the Locker's
// waker or a release in this process wakes the caller, else after a
// back-off (see "Waiting" in the package documentation). It returns the
// Handle, or the error that ended the wait.
func (l *Locker) await(ctx context.Context, key string, ttl, drift time.Duration, desc string) (h *Handle, err error) {
	// Register for wake-ups, then try again before sleeping: a release
	// between the first try and the registration would go unheard.
	w := procHub.watch(l.hubKey, key)
	defer func() { procHub.leave(w, h == nil) }()
	// Queue (see queue.go): the place is kept while the waiter waits and
	// given up when it leaves, with or without the lock.
	q := waitQueue{l: l, key: key, seq: noSeq}
	if l.queued {
		q.owner, q.lease = lease.NewOwner(), l.waitLease(ttl)
		if err := q.join(ctx, w); err != nil {
			return nil, err
		}
		defer func() {
			if h != nil {
				q.leaveHolding(h)
			} else {
				q.leave()
			}
		}()
	}
	notified := l.wake.start(ctx)
	back := backoff.New(2*time.Millisecond, l.cfg.RetryInterval)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	waitNext := true // wait on the waker next (the bell), not sleep
	// A waiter that has just queued looks at its place before it tries:
	// the key was held a moment ago, and a look is a read (a try writes,
	// or on SQLite takes the database's write lock).
	look := l.queued
	for {
		if !look {
			h, err = l.try(ctx, key, ttl, drift, desc, q.seq)
			if lease.IsLate(err) {
				continue // given back; the next try may be quicker
			}
			if err != nil || h != nil {
				return h, err
			}
			w.acted() // the key is held: a wake-up taken so far was acted on
		}
		look = false
		var rem time.Duration
		if l.queued {
			if err := q.keep(ctx, w); err != nil {
				return nil, err
			}
			rem, err = l.queueRemaining(ctx, key, q.seq)
		} else {
			rem, err = l.remaining(ctx, key)
		}
		if err != nil {
			return nil, err
		}
		if rem <= 0 {
			continue // the lease ran out meanwhile, or the row is gone
		}
		// Wait no later than the holder's lease runs out (the database's
		// clock counts in whole microseconds; a millisecond on top covers
		// the statement's own round trip), nor than the waiter's own row
		// needs extending.
		limit := rem + time.Millisecond
		if l.queued {
			limit = min(limit, q.lease/3)
		}
		if waitNext {
			// A waker the waiter waits on itself (the bell) waits as long
			// as the safety net's timer would. After a release that came
			// without the key following (another waiter won it), one
			// short back-off round (the back-off starts again); a wait
			// that did not wait (ok false): the back-off below, which
			// keeps growing.
			rang, ok := l.wake.wait(ctx, w, key, min(l.cfg.RetryInterval, limit))
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if ok {
				waitNext = !rang
				if rang {
					back.Reset()
				}
				select {
				case <-w.c: // a release of this process came meanwhile
					w.woken()
				default:
				}
				continue
			}
		}
		// Releases wake us when the waker is up; the timer is the safety
		// net for a lost wake-up and for a holder that dies without
		// releasing.
		d := l.cfg.RetryInterval
		if !notified && !l.wake.up() {
			d = back.Next()
		}
		waitNext = true
		timer.Reset(min(d, limit))
		select {
		case <-w.c:
			w.woken()
		case <-timer.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		notified = l.wake.up()
	}
}

// try makes one attempt. It returns the Handle, or nil when another holder
// has key.
// seq is the caller's place in the key's waiter queue (noSeq: none).
func (l *Locker) try(ctx context.Context, key string, ttl, drift time.Duration, desc string, seq int64) (*Handle, error) {
	owner := l.ownerValue(lease.NewOwner(), desc)
	sent := time.Now() // the lease starts no earlier than the statement leaves
	token, ok, err := l.runAcquire(ctx, key, owner, ttl, seq)
	for tries, limit := 0, 0; err != nil && l.connGone(err) && ctx.Err() == nil; tries++ {
		// The statement's connection was found gone (a pooled one that
		// died while idle): whether it took the key is unknown. Give back
		// what it may have taken (guarded by its owner, which nobody else
		// has; and again in the background, in case the statement is
		// still running on the server), then run it again on another
		// connection under a new owner, so that a TryAcquire does not
		// report its own row as another holder's.
		if tries == 0 {
			limit = l.goneTries()
		}
		if tries >= limit {
			break
		}
		if _, derr := l.dropOnce(ctx, key, owner); derr != nil {
			break
		}
		l.cleanup(key, owner, ttl)
		owner, sent = lease.NewOwner(), time.Now()
		token, ok, err = l.runAcquire(ctx, key, owner, ttl, seq)
	}
	if err != nil {
		// The statement may have taken the key before the call was cut
		// short (ctx ended, the connection broke after sending it): give
		// it back, so that a failed Acquire leaves nothing behind. The
		// drop is guarded by this attempt's owner, which nobody else has.
		l.cleanup(key, owner, ttl)
		return nil, err
	}
	if !ok {
		return nil, nil
	}
	if late := lease.Late("sqltable", "the database", sent, ttl, drift); late != nil {
		// The grant came back too late to be of use: the Handle would be
		// lost at once, or already is. Give it back (guarded by this
		// attempt's owner); Acquire tries again within its ctx.
		if _, err := l.dropOnce(ctx, key, owner); err != nil {
			l.cleanup(key, owner, ttl)
		}
		return nil, late
	}
	fence, err := l.cfg.Token(token)
	if err != nil {
		// A token beyond 2^62 (a row written by hand, see doc.go): refuse
		// rather than hand out a wrapped-around token, and give the row back.
		if _, derr := l.dropOnce(ctx, key, owner); derr != nil {
			l.cleanup(key, owner, ttl)
		}
		return nil, err
	}
	h := &Handle{l: l, key: key, owner: owner, token: token, fence: fence, ttl: ttl, st: backend.NewState()}
	if seq != noSeq {
		h.dequeued = make(chan struct{}) // closed by await (waitQueue.leaveHolding)
	}
	if !l.life.Hold(h) {
		// Close has begun and will not release h: free the row now,
		// within Close's bound (Close waits for it).
		l.dropClosing(key, owner)
		return nil, locker.ErrClosed
	}
	h.start(sent, drift)
	l.bell.schedule(h)
	return h, nil
}

// keep is what acquire returns for the outcome of try or await, whose
// context (from Life.Enter) is ctx: h, unless Close began after try held
// it, in which case Close has taken h over (it releases it; nothing here
// does it twice) and the caller gets an error wrapping locker.ErrClosed
// instead of a Handle that is already ending.
func (l *Locker) keep(ctx context.Context, op, key string, h *Handle, err error) (*Handle, error) {
	if err != nil || h == nil {
		return nil, backend.KeyError(op, key, l.life.Why(ctx, err))
	}
	if testHookKeep != nil {
		testHookKeep(h)
	}
	if l.life.Closed() {
		h.stop() // Close may have stopped the lease before try started it
		return nil, backend.KeyError(op, key, locker.ErrClosed)
	}
	return h, nil
}

// dropClosing frees key's row if it still carries owner, on the calling
// goroutine, within Close's bound: for an attempt that took the row just
// as Close began.
func (l *Locker) dropClosing(key, owner string) {
	// Once Close no longer waits, Run runs nothing: the lease ends the row.
	l.life.Run(func() { l.dropOnce(l.endCtx, key, owner) })
}

// waitQueue is a waiter's place in its key's queue (queue.go).
type waitQueue struct {
	l          *Locker
	key, owner string
	lease      time.Duration // the waiter row's lease
	seq        int64         // noSeq until queued
	extended   time.Time     // when the row's lease was last set
}

// join queues the waiter's row and puts w in its place in the hub.
func (q *waitQueue) join(ctx context.Context, w *waiter) error {
	q.extended = time.Now()
	seq, err := q.l.enqueue(ctx, q.key, q.owner, q.lease)
	if err != nil {
		q.l.dequeueBackground(q.key, q.owner) // it may have been queued
		return err
	}
	q.seq = seq
	procHub.place(w, seq)
	return nil
}

// keep extends the waiter's row once a third of its lease has passed; a
// row that ran out meanwhile (the waiter was held up that long) lost its
// place, and the waiter queues again at the back.
func (q *waitQueue) keep(ctx context.Context, w *waiter) error {
	if time.Since(q.extended) < q.lease/3 {
		return nil
	}
	at := time.Now()
	ok, err := q.l.extendWait(ctx, q.key, q.owner, q.seq, q.lease)
	if err != nil {
		return err
	}
	if !ok {
		return q.join(ctx, w)
	}
	q.extended = at
	return nil
}

// leave deletes the row of a waiter that gives up and wakes the next
// waiter of the process (the row may have been all that held it back). The
// caller's ctx may be over: the delete has a bound of its own. A delete
// that fails is tried again in the background; meanwhile the row holds the
// queue back no longer than its lease.
func (q *waitQueue) leave() {
	if q.seq == noSeq {
		return
	}
	l := q.l
	ctx, cancel := context.WithTimeout(l.endCtx, time.Second)
	defer cancel()
	if err := l.dequeue(ctx, q.key, q.owner); err != nil {
		l.dequeueBackground(q.key, q.owner)
	}
	l.released(q.key, "")
}

// leaveHolding deletes the row of a waiter that got the lock as h, off the
// caller's path: the holder's row holds nobody back while it holds the
// lock, only once it releases, and h's Release waits for the delete (see
// Handle.dequeued) before it frees the lock.
func (q *waitQueue) leaveHolding(h *Handle) {
	l := q.l
	run := func() {
		defer close(h.dequeued)
		ctx, cancel := context.WithTimeout(l.endCtx, cleanupTimeout)
		defer cancel()
		_ = l.dequeue(ctx, q.key, q.owner) // else its lease ends it
	}
	if !l.life.Go(run) {
		run() // Close has begun: within its bound
	}
}
