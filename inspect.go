package locker

import (
	"context"
	"time"
)

// Inspector is implemented by Lockers that can tell who holds a key: for
// operators, dashboards and the locker command's status. It is optional,
// found by type assertion (the way database/sql finds optional driver
// interfaces), so a backend that cannot answer honestly does not implement
// it, and third-party backends written before it keep working:
//
//	if in, ok := l.(locker.Inspector); ok {
//		info, err := in.Inspect(ctx, "payment/42")
//		...
//	}
//
// The conformance suite checks an Inspector when the backend has one.
type Inspector interface {
	// Inspect reports the state of key's lock as the backend sees it at the
	// moment it answers. It takes no lock, renews nothing and changes
	// nothing. The answer may be stale by the time the caller reads it: it
	// is for looking, never for deciding who may write (that is what the
	// fencing token is for).
	Inspect(ctx context.Context, key string) (LockInfo, error)
}

// LockInfo is what an Inspector knows of one key's lock.
type LockInfo struct {
	// Key is the key as the caller gave it.
	Key string
	// Held reports whether a holder has the lock.
	Held bool
	// Token is the holder's fencing token, or 0 when the key is not held.
	// It is the token the holder's Handle reports when the inspecting
	// Locker has the holder's token base (see MaxTokenBase): a Locker adds
	// its own base to the backend's token.
	Token int64
	// TTL is the holder's remaining lease as the backend sees it, or 0 when
	// the key is not held or the backend's locks have no lease (a session
	// lock, held until its session ends).
	TTL time.Duration
	// Lease is the full lease the holder was given (its Handle's TTL), or 0
	// when the key is not held or the backend cannot tell (each backend's
	// Inspect says which).
	Lease time.Duration
	// Owner is the holder's description given with WithOwner when it
	// acquired the lock, or "" when the key is not held, the holder gave
	// none, or the backend cannot store it (each backend's Inspect says).
	// It is what the holder said of itself, not a verified identity.
	Owner string
}
