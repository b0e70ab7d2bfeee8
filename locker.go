package locker

import "context"

// Locker takes locks on keys in one keyspace shared by every client of the same
// backend. Implementations must be safe for concurrent use by multiple goroutines.
//
// Locks are not reentrant: a second Acquire of a key that the same Locker already
// holds waits like any other client would.
type Locker interface {
	// Acquire blocks until key is held, ctx is done, or the backend fails.
	// When ctx ends first the error wraps ctx.Err() (so errors.Is(err,
	// context.Canceled) holds), and the abandoned wait must leave nothing behind
	// that blocks or confuses later acquirers.
	Acquire(ctx context.Context, key string, opts ...Option) (Handle, error)

	// TryAcquire makes one attempt and does not wait for the current holder.
	// When another holder has key the error wraps ErrNotAcquired.
	TryAcquire(ctx context.Context, key string, opts ...Option) (Handle, error)

	// Close releases every lock this Locker still holds, stops its background
	// work and frees its resources. The Handles it held end with
	// ErrReleasedByClose, which wraps both ErrReleased and ErrClosed (or, for a
	// lock Close could not release because the backend was unreachable, an
	// error wrapping ErrLost and ErrClosed, and Close returns an error); its
	// waiting Acquires return errors wrapping ErrClosed, as do later calls.
	//
	// Close is bounded: it waits at most ReleaseTimeout (or the backend's
	// stated bound) for the release of the held locks, then a short grace,
	// stated in the backend's Close doc, for calls and goroutines in flight.
	// No goroutine started by the Locker outlives Close, except what the
	// backend's Close doc names (a request stuck on a dead connection of a
	// client the caller owns, until its socket deadline); with a client the
	// Locker owns (opened from a URL), nothing does. A second Close waits
	// for the first and returns nil.
	Close() error
}

// Handle is one holder's grip on one key. It is safe for concurrent use.
type Handle interface {
	// Key is the key as the caller gave it.
	Key() string

	// Token is the fencing token of this acquisition: positive, and strictly
	// greater than the token of every earlier holder of the same key on the same
	// backend. Pass it to the protected resource, which must reject writes that
	// carry a token lower than one it has already seen.
	Token() int64

	// Done is closed once the lock is no longer held: released, or lost.
	Done() <-chan struct{}

	// Err is nil while the lock is held; after Done is closed it is ErrReleased
	// after Release, or an error wrapping ErrLost when the lock was lost.
	Err() error

	// Release gives the lock up. It never removes a lock that another holder has
	// since acquired. A second Release returns an error wrapping ErrReleased; a
	// Release after loss returns an error wrapping ErrLost.
	//
	// Release gives the lock up even when it fails (the backend cannot be
	// reached, ctx ends first): when it returns, Done is closed and nothing
	// renews the lock any more, and a lock the backend could not be told
	// about ends with its lease or session. So a caller need not retry.
	Release(ctx context.Context) error
}
