package redis

import (
	"context"
	"encoding/base64"
	"fmt"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/redis/internal/releases"
)

// The Locker has every lock family: semaphores and reader-writer locks, each
// in a keyspace of its own (see "Lock families" in the package
// documentation, and families_scripts.go for the scripts). Their locks are
// acquired, waited for, renewed, lost and released by the same machinery as
// the mutex's (attempt, wait, Handle), through the family's scripts.
var (
	_ locker.Semaphorer = (*Locker)(nil)
	_ locker.ReadWriter = (*Locker)(nil)
)

// family is a lock family: the mutex, or one with a keyspace of its own.
type family uint8

const (
	famMutex family = iota
	famSemaphore
	famRW
)

// space is the part of a family's names after the key's hash tag.
func (f family) space() string {
	if f == famSemaphore {
		return ":sem:"
	}
	return ":rw:"
}

// famSpec is what an acquisition asks for: a family, the kind of holder
// (the first byte of its owner token: 'p' a permit, 'r' a reader, 'w' a
// writer) and a semaphore's limit.
type famSpec struct {
	fam   family
	kind  byte
	limit int
}

var (
	mutexSpec = famSpec{}
	readSpec  = famSpec{fam: famRW, kind: 'r'}
	writeSpec = famSpec{fam: famRW, kind: 'w'}
)

func semSpec(n int) famSpec { return famSpec{fam: famSemaphore, kind: 'p', limit: n} }

// famKeysFor returns the names of key in family f: the mutex's hash tag
// (base64url of the key, so one Cluster slot for all of a key's names),
// then ":sem:" or ":rw:", then the name's own suffix. No mutex name has a
// second ':' after its tag but its wake-up channels, which go on with
// "wake:", so no two (family, key) pairs share a name.
func (l *Locker) famKeysFor(f family, key string) keys {
	tag := l.cfg.Prefix + "{" + base64.RawURLEncoding.EncodeToString([]byte(key)) + "}" + f.space()
	wakeBase := tag + "wake:"
	return keys{
		fam:      f,
		lock:     tag + "holders",
		leases:   tag + "leases",
		fence:    tag + "fence",
		limit:    tag + "limit",
		released: tag + releases.Suffix[1:],
		queue:    tag + "queue",
		waiters:  tag + "waiters",
		wakeBase: wakeBase,
		wake:     wakeBase + l.id,
	}
}

// AcquireSemaphore takes one of the n permits of key, waiting as long as
// ctx allows while all n are held, or others wait for one first (first
// come, first served; a freed permit wakes one waiter). n must be at least
// 1, and the same as the n of the key's holders and waiters: a different n
// fails at once with an error wrapping locker.ErrLimitMismatch.
func (l *Locker) AcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	const op = "acquire-semaphore"
	if n < 1 {
		return nil, badLimit(op, key, n)
	}
	return backend.AsHandle(l.acquire(ctx, op, key, semSpec(n), opts, true))
}

// TryAcquireSemaphore takes one of the n permits of key if one is free and
// nobody waits for it, and fails with an error wrapping
// locker.ErrNotAcquired otherwise.
func (l *Locker) TryAcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	const op = "try-acquire-semaphore"
	if n < 1 {
		return nil, badLimit(op, key, n)
	}
	return backend.AsHandle(l.acquire(ctx, op, key, semSpec(n), opts, false))
}

func badLimit(op, key string, n int) error {
	return backend.KeyError(op, key, fmt.Errorf("%w: a semaphore's limit must be at least 1, got %d", locker.ErrInvalidOption, n))
}

// AcquireRead takes key for reading, waiting as long as ctx allows while a
// writer holds it or a writer that came first waits for it.
func (l *Locker) AcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "acquire-read", key, readSpec, opts, true))
}

// TryAcquireRead takes key for reading if no writer holds it or waits for
// it, and fails with an error wrapping locker.ErrNotAcquired otherwise.
func (l *Locker) TryAcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "try-acquire-read", key, readSpec, opts, false))
}

// AcquireWrite takes key for writing, waiting as long as ctx allows while
// any reader or writer holds it or waits for it first.
func (l *Locker) AcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "acquire-write", key, writeSpec, opts, true))
}

// TryAcquireWrite takes key for writing if nobody holds it or waits for
// it, and fails with an error wrapping locker.ErrNotAcquired otherwise.
func (l *Locker) TryAcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "try-acquire-write", key, writeSpec, opts, false))
}
