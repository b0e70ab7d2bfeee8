package locker

import (
	"context"
	"errors"
	"fmt"
)

// Lock families beyond the mutex: counting semaphores and reader-writer
// locks. A backend that has them implements Semaphorer and ReadWriter, found
// by type assertion (as Inspector is); Semaphore, ReadLock and WriteLock turn
// them into Lockers, so that Do, TryDo, Lead and AcquireAll work on them as on
// the mutex. Multi-locks (AcquireAll) need nothing of the backend.
//
// Each family has a keyspace of its own: the mutex "k", the reader-writer
// lock "k" and the semaphore "k" are three different locks that never wait
// for each other. Every other rule of the mutex holds for every family:
// every permit, read lock and write lock is a Handle with a fencing token,
// Done/Err on loss, a lease (WithTTL) renewed while its holder lives, waiting
// woken by notifications, and a cancelled wait leaves nothing behind.

// ErrUnsupported reports a lock family the Locker does not have: a Locker
// that does not implement Semaphorer or ReadWriter given to Semaphore,
// ReadLock or WriteLock. It wraps errors.ErrUnsupported.
var ErrUnsupported = fmt.Errorf("locker: %w", errors.ErrUnsupported)

// ErrLimitMismatch reports a semaphore acquisition whose limit n differs
// from the limit of the permits already held on its key: the holders of a
// key must agree on n, and a second limit is refused rather than obeyed
// silently. It is returned at once, also by a waiting Acquire.
var ErrLimitMismatch = errors.New("locker: semaphore limit differs from its holders'")

// Semaphorer is implemented by a Locker that has counting semaphores: at
// most n holders of a key at once.
//
// Each acquisition takes one permit and returns it as a Handle. Its token is
// strictly greater than the token of every permit of the key granted before
// it (a resource fenced by tokens refuses the writes of a holder whose permit
// was taken away and granted again). n must be at least 1; every holder of a
// key must ask for the same n, else the acquisition fails with an error
// wrapping ErrLimitMismatch. Waiting is fair (first come, first served) and
// woken by notifications: a freed permit wakes one waiter, not all.
type Semaphorer interface {
	// AcquireSemaphore blocks until one of the n permits of key is held,
	// ctx is done (an error wrapping ctx.Err()), or the backend fails.
	AcquireSemaphore(ctx context.Context, key string, n int, opts ...Option) (Handle, error)
	// TryAcquireSemaphore makes one attempt; when all n permits are held
	// by others the error wraps ErrNotAcquired.
	TryAcquireSemaphore(ctx context.Context, key string, n int, opts ...Option) (Handle, error)
}

// ReadWriter is implemented by a Locker that has reader-writer locks: any
// number of readers of a key at once, or one writer.
//
// Waiting is first come, first served across readers and writers: a reader
// that comes after a waiting writer waits behind it, so a stream of readers
// never starves a writer, and readers that queue together are admitted
// together. Readers and writers of a key draw their tokens from one
// sequence: a writer's token is greater than the token of every reader and
// writer before it, so a resource that has seen a reader's token can refuse
// a write from a stale writer holding an older one.
type ReadWriter interface {
	// AcquireRead blocks until key is held for reading, ctx is done, or
	// the backend fails.
	AcquireRead(ctx context.Context, key string, opts ...Option) (Handle, error)
	// TryAcquireRead makes one attempt; when a writer holds key, or waits
	// for it, the error wraps ErrNotAcquired.
	TryAcquireRead(ctx context.Context, key string, opts ...Option) (Handle, error)
	// AcquireWrite blocks until key is held for writing (no reader and no
	// other writer holds it), ctx is done, or the backend fails.
	AcquireWrite(ctx context.Context, key string, opts ...Option) (Handle, error)
	// TryAcquireWrite makes one attempt; when any reader or writer holds
	// key the error wraps ErrNotAcquired.
	TryAcquireWrite(ctx context.Context, key string, opts ...Option) (Handle, error)
}

// Semaphore returns a Locker whose Acquire and TryAcquire take one of the n
// permits of a key of l's semaphores (see Semaphorer). If l has no
// semaphores, or n is below 1, every call of the returned Locker fails with
// an error wrapping ErrUnsupported or ErrInvalidOption.
//
// The returned Locker is a view of l: its Close does nothing (close l, which
// releases what was taken through every view of it).
func Semaphore(l Locker, n int) Locker {
	s, ok := l.(Semaphorer)
	v := &view{Locker: l}
	switch {
	case !ok:
		v.err = fmt.Errorf("%w: %T has no semaphores", ErrUnsupported, l)
	case n < 1:
		v.err = fmt.Errorf("%w: a semaphore's limit must be at least 1, got %d", ErrInvalidOption, n)
	default:
		v.acquire = func(ctx context.Context, key string, opts []Option) (Handle, error) {
			return s.AcquireSemaphore(ctx, key, n, opts...)
		}
		v.try = func(ctx context.Context, key string, opts []Option) (Handle, error) {
			return s.TryAcquireSemaphore(ctx, key, n, opts...)
		}
	}
	return v
}

// ReadLock returns a Locker whose Acquire and TryAcquire take the read lock
// of a key of l's reader-writer locks (see ReadWriter). If l has none, every
// call fails with an error wrapping ErrUnsupported. Like Semaphore's, the
// returned Locker is a view of l whose Close does nothing.
func ReadLock(l Locker) Locker { return rwView(l, true) }

// WriteLock returns a Locker whose Acquire and TryAcquire take the write
// lock of a key of l's reader-writer locks (see ReadWriter). If l has none,
// every call fails with an error wrapping ErrUnsupported. Like Semaphore's,
// the returned Locker is a view of l whose Close does nothing.
func WriteLock(l Locker) Locker { return rwView(l, false) }

func rwView(l Locker, read bool) Locker {
	rw, ok := l.(ReadWriter)
	v := &view{Locker: l}
	switch {
	case !ok:
		v.err = fmt.Errorf("%w: %T has no reader-writer locks", ErrUnsupported, l)
	case read:
		v.acquire = func(ctx context.Context, key string, opts []Option) (Handle, error) {
			return rw.AcquireRead(ctx, key, opts...)
		}
		v.try = func(ctx context.Context, key string, opts []Option) (Handle, error) {
			return rw.TryAcquireRead(ctx, key, opts...)
		}
	default:
		v.acquire = func(ctx context.Context, key string, opts []Option) (Handle, error) {
			return rw.AcquireWrite(ctx, key, opts...)
		}
		v.try = func(ctx context.Context, key string, opts []Option) (Handle, error) {
			return rw.TryAcquireWrite(ctx, key, opts...)
		}
	}
	return v
}

// view is a Locker over one family of another Locker's locks.
type view struct {
	Locker        // the Locker viewed; its Acquire and TryAcquire are not used
	err     error // set when the family cannot be had: every call fails with it
	acquire func(ctx context.Context, key string, opts []Option) (Handle, error)
	try     func(ctx context.Context, key string, opts []Option) (Handle, error)
}

func (v *view) Acquire(ctx context.Context, key string, opts ...Option) (Handle, error) {
	if v.err != nil {
		return nil, &Error{Op: "acquire", Key: key, Err: v.err}
	}
	return v.acquire(ctx, key, opts)
}

func (v *view) TryAcquire(ctx context.Context, key string, opts ...Option) (Handle, error) {
	if v.err != nil {
		return nil, &Error{Op: "try-acquire", Key: key, Err: v.err}
	}
	return v.try(ctx, key, opts)
}

// Close does nothing: the view does not own the Locker it views.
func (v *view) Close() error { return nil }
