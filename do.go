package locker

import (
	"context"
	"time"
)

// ReleaseTimeout bounds the Release that Do performs after fn returns. Release
// runs even when ctx is already cancelled, so it needs a deadline of its own.
const ReleaseTimeout = 10 * time.Second

// Do acquires key on l (waiting as Acquire does), runs fn while holding it, and
// releases the lock afterwards whatever fn returns, even when fn panics.
// fn gets the Handle for its fencing token (h.Token()), to send with every
// write to the resource the lock protects; fn need not release it (if it
// does, Do does not report the second Release).
//
// The context passed to fn is cancelled when ctx is, and also as soon as the
// lock ends: context.Cause then is the handle's Err — wrapping ErrLost when
// the lock was lost, ErrReleasedByClose when its Locker was closed. fn should
// stop its work promptly when its context ends.
//
// Do returns fn's error joined with any error from releasing. When the lock
// ended while fn ran, the result says why (it wraps ErrLost, or ErrClosed)
// even if fn returned nil: the work was not protected throughout.
func Do(ctx context.Context, l Locker, key string, fn func(ctx context.Context, h Handle) error, opts ...Option) (err error) {
	h, err := l.Acquire(ctx, key, opts...)
	if err != nil {
		return err
	}
	return hold(ctx, h, fn)
}
