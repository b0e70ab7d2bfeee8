package locker

import (
	"context"
	"time"
)

// The TTL contract, the same on every backend.
//
// WithTTL(d) is the longest a lock may outlive a holder that went silent:
// one that stopped renewing (it crashed, was paused, or was partitioned
// from the backend). Within d of the holder's last word to the backend the
// lock is free for others, on every backend; a live, connected holder keeps
// it for as long as it wants (the backend renews it).
//
// Every backend accepts every TTL in [MinTTL, MaxTTL], the portable range,
// and a lock taken without WithTTL has DefaultTTL on every backend. A TTL
// outside the range is refused by WithTTL itself, on every backend, with an
// error wrapping ErrInvalidOption that names the range.
//
// Where a backend cannot give a lease of exactly the TTL asked, it does the
// nearest safe thing, the same way everywhere:
//   - it gives a shorter lease rather than a longer one (a shorter lease is
//     safe for exclusion: the holder renews sooner, and hears of a loss
//     sooner): a server that counts leases in whole seconds rounds down, a
//     server with a lease ceiling gives the ceiling;
//   - it gives a longer lease only where the server cannot go lower (etcd's
//     minimum lease, ZooKeeper's minimum session timeout), and then exactly
//     the server's minimum;
//
// and it reports the lease it gave: Handle.TTL, and LockInfo.Lease where the
// backend is an Inspector. So a caller that needs to know how long a silent
// holder may block others reads Handle.TTL, not what it asked for.
const (
	// MinTTL is the shortest TTL of the portable range.
	MinTTL = time.Second
	// MaxTTL is the longest TTL of the portable range.
	MaxTTL = 24 * time.Hour
	// DefaultTTL is the lease of a lock taken without WithTTL, on every
	// backend (a backend's option for its Lockers' default TTL may change it
	// for one Locker, within [MinTTL, MaxTTL]).
	DefaultTTL = 30 * time.Second
)

// The token base, the same on every backend.
//
// Backends draw fencing tokens from different ranges: a counter from 1
// (memlock, redis, redis/redlock, a PostgreSQL sequence), the cluster's
// revision (etcd), the ZooKeeper transaction id (about 2^32 per leader
// epoch), the database clock in microseconds (sqltable: about 1.8e15). A
// resource fenced on one backend's tokens would refuse every write of a
// backend with a lower range, or accept a stale holder's writes from one
// with a higher range. So every backend has one option, the same
// everywhere, that moves its tokens above a floor the operator sets:
// WithTokenBase(n) in each backend package, URL parameter token_base=n.
//
// The rule is an offset: a Locker with base n hands out n + t where t is
// the token the backend would have given without a base, and reports the
// same n + t in Handle.Token and LockInfo.Token. Every token is then above
// n (t is positive) and tokens still strictly increase per key across
// holders (t does). A floor, max(n, t), would not do: the holders of a key
// whose t stays below n would all get n, on every backend, and etcd's
// revisions and ZooKeeper's zxids cannot be made to jump above a floor on
// the server. An offset needs no state on the server, so it means the same
// on every backend, ours or a third party's.
//
// Because the base is added by the client, every Locker of a deployment
// must have the same base, as it must have the same prefix: Lockers with
// different bases exclude each other but hand out tokens that are not
// ordered. Raise the base only as README's "Changing backends" says (every
// Locker at once, old holders stopped), and never lower it: tokens would
// go backwards.
//
// The base is in [0, MaxTokenBase]; a negative base or one above
// MaxTokenBase is refused (an error wrapping ErrInvalidOption, or
// ErrInvalidURL from a URL). Zero, the default, gives the backend's own
// tokens. The sum cannot overflow an int64 for any token a backend issues
// in its own range: MaxTokenBase is 2^62, and every backend's own tokens
// stay below 2^62 - 1 (each backend's doc.go says why, under "Fencing
// tokens"); a backend that meets a larger own token (a counter written
// by hand) refuses the acquisition with an error wrapping
// ErrInvalidOption rather than wrap around.
//
// MaxTokenBase is the largest token base: 2^62, about 4.6e18, far above
// every backend's own tokens (the largest, sqltable's microsecond clock,
// is about 1.8e15 ≈ 2^51), so a deployment can change backends many times,
// each time setting the base above the highest token issued so far.
const MaxTokenBase int64 = 1 << 62

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

	// Token is the fencing token of this acquisition: positive, above the
	// Locker's token base (see MaxTokenBase), and strictly greater than the
	// token of every earlier holder of the same key on the same backend and
	// base. Pass it to the protected resource, which must reject writes that
	// carry a token lower than one it has already seen.
	Token() int64

	// Done is closed once the lock is no longer held: released, or lost.
	Done() <-chan struct{}

	// Err is nil while the lock is held; after Done is closed it is ErrReleased
	// after Release, or an error wrapping ErrLost when the lock was lost.
	Err() error

	// TTL is the lease the backend gave this lock: the longest the lock
	// outlives this holder once it goes silent (see MinTTL for the rule). It
	// is the TTL asked (WithTTL, else the Locker's default) unless the
	// backend could not give exactly that, and then what it gave instead:
	// rounded down to the server's unit, the server's ceiling, or the
	// server's minimum, never anything else. It is positive and does not
	// change while the lock is held; a session backend reports its session's
	// timeout as granted by the server.
	TTL() time.Duration

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

// AtRisker is implemented by the Handles of backends that can tell that a
// held lock may be lost soon, before it is: a renewal failed (a lease
// backend: redis, redis/redlock, sqltable), etcd's keep-alive is failing,
// a ZooKeeper client is disconnected from its server (the session may
// still be alive), PostgreSQL's health check of the lock's connection is
// failing. It is Curator's SUSPENDED and RECONNECTED: a holder can pause
// its writes while its lock is at risk and resume once it has cleared,
// rather than learn of the loss only when Done closes. Find it by type
// assertion, as Inspector:
//
//	if r, ok := h.(locker.AtRisker); ok {
//		for {
//			risk, changed := r.AtRisk()
//			pauseWrites(risk)
//			select {
//			case <-changed:
//			case <-h.Done():
//				return
//			}
//		}
//	}
//
// A backend that cannot lose a lock to a fault it could see coming
// (memlock) does not implement it.
type AtRisker interface {
	// AtRisk reports whether the lock is at risk now, and a channel that
	// is closed at the next change of that answer: at risk when the
	// backend's last word on the lock was a failure (it keeps retrying;
	// the lock is lost if none succeeds before its lease runs out),
	// cleared when a renewal or reconnection succeeded again. A lock is
	// not at risk when acquired. Once the lock has ended (Done is
	// closed) the answer no longer changes: watch Done as well.
	AtRisk() (atRisk bool, changed <-chan struct{})
}
