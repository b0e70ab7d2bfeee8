package zookeeper

import (
	"context"
	"fmt"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// The Locker has every lock family: reader-writer locks and semaphores (see
// locker.ReadWriter and locker.Semaphorer), each in a directory of its own
// per key (ReadWriteDir, SemaphoreDir), with the mutex's machinery: the
// GUID-protected nodes and their create, the session of the lock's TTL,
// loss, release, Close. See the package documentation for the recipes.
var (
	_ locker.Semaphorer = (*Locker)(nil)
	_ locker.ReadWriter = (*Locker)(nil)
)

// ask is what an acquisition asks for: a node kind, and a semaphore's
// limit.
type ask struct {
	kind  nodeKind
	limit int // kindPermit only
	// desc is the node's data: the holder's locker.WithOwner description,
	// which Inspect reports (a mutex's only; the families' nodes have none).
	desc string
}

// data is what a's node is created with.
func (a ask) data() []byte {
	if a.desc == "" {
		return nil
	}
	return []byte(a.desc)
}

var (
	mutexAsk = ask{kind: kindLock}
	readAsk  = ask{kind: kindRead}
	writeAsk = ask{kind: kindWrite}
)

// dir is the path of key's directory in a's family under root.
func (a ask) dir(root, key string) string {
	switch a.kind {
	case kindRead, kindWrite:
		return ReadWriteDir(root, key)
	case kindPermit:
		return SemaphoreDir(root, key)
	}
	return LockDir(root, key)
}

// nodeName is the name (without sequence) of a contender's node for a.
func (a ask) nodeName(guid string) string { return nodeName(guid, a.kind, a.limit) }

// AcquireSemaphore waits until one of the n permits of key is held, ctx
// ends, or the Locker is closed. Waiters get permits in the order they
// arrived (the sequence of their nodes). A limit other than the one of the
// nodes already in the key's directory (holders or waiters) fails at once
// with an error wrapping locker.ErrLimitMismatch.
func (l *Locker) AcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	const op = "acquire-semaphore"
	if err := l.checkSemaphore(op, key, n); err != nil {
		return nil, err
	}
	return backend.AsHandle(l.acquire(ctx, op, key, ask{kind: kindPermit, limit: n}, true, opts))
}

// TryAcquireSemaphore takes one of the n permits of key if one is free and
// nobody waits for it, and fails with an error wrapping
// locker.ErrNotAcquired otherwise, without waiting.
func (l *Locker) TryAcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	const op = "try-acquire-semaphore"
	if err := l.checkSemaphore(op, key, n); err != nil {
		return nil, err
	}
	return backend.AsHandle(l.acquire(ctx, op, key, ask{kind: kindPermit, limit: n}, false, opts))
}

// checkSemaphore refuses a limit below 1, and an ACL (WithACL) that lets
// nobody write the nodes: a permit that gets in writes its node's data to
// wake the waiter after it (see relay).
func (l *Locker) checkSemaphore(op, key string, n int) error {
	if n < 1 {
		return backend.KeyError(op, key, fmt.Errorf("%w: a semaphore's limit must be at least 1, got %d", locker.ErrInvalidOption, n))
	}
	for _, a := range l.cfg.acl {
		if a.Perms&zk.PermWrite != 0 {
			return nil
		}
	}
	return backend.KeyError(op, key, fmt.Errorf("%w: the ACL of the lock nodes (WithACL) grants nobody WRITE, which a semaphore's permits need: one that gets in writes its node to wake the waiter after it", locker.ErrInvalidOption))
}

// AcquireRead waits until key is held for reading (no writer holds it, and
// none that came first still waits for it), ctx ends, or the Locker is
// closed.
func (l *Locker) AcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "acquire-read", key, readAsk, true, opts))
}

// TryAcquireRead takes key for reading if no writer holds it or waits for
// it, and fails with an error wrapping locker.ErrNotAcquired otherwise.
func (l *Locker) TryAcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "try-acquire-read", key, readAsk, false, opts))
}

// AcquireWrite waits until key is held for writing (no reader or writer
// holds it, and none that came first waits for it), ctx ends, or the
// Locker is closed.
func (l *Locker) AcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "acquire-write", key, writeAsk, true, opts))
}

// TryAcquireWrite takes key for writing if nobody holds it or waits for it,
// and fails with an error wrapping locker.ErrNotAcquired otherwise.
func (l *Locker) TryAcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "try-acquire-write", key, writeAsk, false, opts))
}
