package locker

import (
	"context"
	"errors"
	"time"

	"github.com/go-locker/locker/internal/backoff"
)

// HandleContext returns a copy of ctx that is also cancelled as soon as h's
// lock ends, released or lost; context.Cause then returns h.Err() (wrapping
// ErrLost after a loss, ErrReleasedByClose after its Locker closed). Work
// that must stop when the lock goes runs under it. cancel releases the
// context's resources (a goroutine that watches h); it does not release the
// lock.
func HandleContext(ctx context.Context, h Handle) (context.Context, context.CancelFunc) {
	return endContext(ctx, h)
}

// ending is what Do's plumbing needs of a lock: a Handle, or a Multi.
type ending interface {
	Done() <-chan struct{}
	Err() error
	Release(ctx context.Context) error
}

// endContext is HandleContext for a Handle or a Multi.
func endContext(ctx context.Context, h ending) (context.Context, context.CancelFunc) {
	hctx, cancel := context.WithCancelCause(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-h.Done():
			cancel(h.Err())
		case <-hctx.Done():
		}
	}()
	return hctx, func() {
		cancel(nil)
		<-watched
	}
}

// TryDo is Do with a single attempt: when another holder has key it returns
// an error wrapping ErrNotAcquired without calling fn. It is the form for
// work that one instance should do and the others skip — a payment already
// being charged (answer 409 Conflict), a cron tick another instance has
// taken.
func TryDo(ctx context.Context, l Locker, key string, fn func(ctx context.Context, h Handle) error, opts ...Option) error {
	h, err := l.TryAcquire(ctx, key, opts...)
	if err != nil {
		return err
	}
	return hold(ctx, h, fn)
}

// Lead campaigns for the leadership named by key: it waits for the lock
// (Acquire), runs fn as the leader with a context that is cancelled when the
// lock is lost (see HandleContext), and steps down — releases the lock —
// when fn returns or the lock is lost. Then it campaigns again, until ctx
// ends; it returns an error wrapping ctx.Err() then, having stepped down.
//
// fn should run until its context ends. If it returns nil earlier, the
// leader steps down and campaigns again at once (others may win meanwhile).
// If it returns an error while the lock is still held, Lead steps down and
// returns that error: a leader whose work fails does not keep the lock. An
// error after the lock was lost is the loss's doing, not fn's: Lead
// campaigns again.
//
// A campaign that fails for a reason other than ctx (the backend is
// unreachable) is retried after a jittered back-off of up to retryMax; an
// invalid key or option, or a closed Locker, ends Lead with that error.
// The current leader's fencing token is h.Token(): a newer leader's is
// higher, so a resource can refuse a deposed leader's late writes.
func Lead(ctx context.Context, l Locker, key string, fn func(ctx context.Context, h Handle) error, opts ...Option) error {
	retry := backoff.New(leadRetryMin, leadRetryMax)
	for {
		h, err := l.Acquire(ctx, key, opts...)
		switch {
		case ctx.Err() != nil:
			if err == nil {
				releaseDetached(ctx, h)
			}
			return keyError("lead", key, contextError(ctx))
		case errors.Is(err, ErrInvalidKey), errors.Is(err, ErrInvalidOption), errors.Is(err, ErrClosed):
			return err
		case err != nil:
			// Jittered, so that the followers of a failed backend do not
			// all come back in the same instant.
			if !retry.Wait(ctx) {
				return keyError("lead", key, contextError(ctx))
			}
			continue
		}
		retry.Reset()
		ferr := hold(ctx, h, fn)
		switch herr := h.Err(); {
		case ctx.Err() != nil:
			return keyError("lead", key, contextError(ctx))
		case errors.Is(herr, ErrClosed):
			return keyError("lead", key, herr)
		case errors.Is(herr, ErrLost):
			// Deposed: campaign again, whatever fn made of it.
		case ferr != nil:
			return ferr
		}
	}
}

// The back-off of Lead between failed campaigns.
const (
	leadRetryMin = 50 * time.Millisecond
	leadRetryMax = 5 * time.Second
)

// hold runs fn while h is held and releases h afterwards: the body of Do,
// TryDo, Lead, DoAll and TryDoAll.
func hold[H ending](ctx context.Context, h H, fn func(ctx context.Context, h H) error) (err error) {
	fnCtx, stop := endContext(ctx, h)
	defer func() {
		stop()
		relErr := releaseDetached(ctx, h)
		if errors.Is(relErr, ErrReleased) && !errors.Is(relErr, ErrClosed) {
			relErr = nil // fn released the lock itself
		}
		err = errors.Join(err, relErr)
	}()
	return fn(fnCtx, h)
}

// releaseDetached releases h with a deadline of its own, even when ctx has
// ended.
func releaseDetached(ctx context.Context, h ending) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ReleaseTimeout)
	defer cancel()
	return h.Release(rctx)
}
