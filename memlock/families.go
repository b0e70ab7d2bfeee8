package memlock

import (
	"context"
	"fmt"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// memlock has every lock family: semaphores and reader-writer locks, each in
// a keyspace of its own (see locker.Semaphorer and locker.ReadWriter). Their
// locks are granted, renewed, lost and released like the mutex's, by the
// same Store, and draw their tokens from the Store's one sequence.
var (
	_ locker.Semaphorer = (*Locker)(nil)
	_ locker.ReadWriter = (*Locker)(nil)
)

// AcquireSemaphore waits until one of the n permits of key is held, ctx is
// done, or the Locker is closed. Waiters get permits in the order they
// started waiting.
func (l *Locker) AcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	const op = "acquire-semaphore"
	if n < 1 {
		return nil, badLimit(op, key, n)
	}
	return l.acquire(ctx, op, key, semaphoreMode(n), true, opts)
}

// TryAcquireSemaphore takes one of the n permits of key if one is free and
// nobody waits for it, and fails with an error wrapping
// locker.ErrNotAcquired otherwise.
func (l *Locker) TryAcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	const op = "try-acquire-semaphore"
	if n < 1 {
		return nil, badLimit(op, key, n)
	}
	return l.acquire(ctx, op, key, semaphoreMode(n), false, opts)
}

func badLimit(op, key string, n int) error {
	return backend.KeyError(op, key, fmt.Errorf("%w: a semaphore's limit must be at least 1, got %d", locker.ErrInvalidOption, n))
}

// AcquireRead waits until key is held for reading: no writer holds it, and
// no writer that came first still waits for it.
func (l *Locker) AcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return l.acquire(ctx, "acquire-read", key, rwRead, true, opts)
}

// TryAcquireRead takes key for reading if no writer holds it or waits for
// it, and fails with an error wrapping locker.ErrNotAcquired otherwise.
func (l *Locker) TryAcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return l.acquire(ctx, "try-acquire-read", key, rwRead, false, opts)
}

// AcquireWrite waits until key is held for writing: no reader or writer
// holds it.
func (l *Locker) AcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return l.acquire(ctx, "acquire-write", key, rwWrite, true, opts)
}

// TryAcquireWrite takes key for writing if nobody holds it or waits for
// it, and fails with an error wrapping locker.ErrNotAcquired otherwise.
func (l *Locker) TryAcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return l.acquire(ctx, "try-acquire-write", key, rwWrite, false, opts)
}
