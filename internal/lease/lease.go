// Package lease is what the lease-based backends (redis, redis/redlock,
// sqltable) share above their protocol: the lease handle (Handle: the
// lock's identity, state and lease, and the verdicts of Release, of a loss
// and of Close, given the backend's own release and clean-up), and the
// lease arithmetic: the bounds of a TTL, the drift margin by which a holder
// gives a lock up before its lease may have run out on the server, the TTL
// of one call from its options, and grants that came back too late. The
// messages name the backend, so a user sees which Locker refused.
//
// The timing of one lease (when to renew, when it is lost) is
// internal/renew's, a package of its own: it knows nothing of locks or
// errors of this module, and etcd, which keeps its handle's state apart,
// uses it too.
package lease

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// Limits are a backend's checks of its lease settings. The lease itself has
// one range on every backend, [locker.MinTTL, locker.MaxTTL]
// (backend.CheckTTL); Backend names the backend in errors: "redis".
type Limits struct {
	Backend string
}

// Check reports a TTL outside the portable range as an error wrapping
// locker.ErrInvalidOption that names the range and the backend.
func (l Limits) Check(ttl time.Duration) error {
	return backend.CheckTTL(l.Backend, ttl)
}

// TTL returns the lease of one call: the per-call locker.WithTTL if opts
// has one (WithTTL checked it against the portable range), else def.
func (l Limits) TTL(def time.Duration, opts []locker.Option) (time.Duration, error) {
	o, err := backend.ApplyOptions(opts...)
	if err != nil {
		return 0, err
	}
	if o.TTL == 0 {
		return def, nil
	}
	return o.TTL, nil
}

// DefaultDrift is the drift margin of a lease of ttl when none is
// configured: TTL/50 + 100ms, at most TTL/4. The 2% covers the client's
// and the server's clocks running at different rates; the 100ms, timer
// latency and short stalls of a loaded holder.
func DefaultDrift(ttl time.Duration) time.Duration {
	return min(ttl/50+100*time.Millisecond, ttl/4)
}

// Drift returns the drift margin for a lease of ttl: configured, or
// DefaultDrift when configured is 0. A margin of half the TTL or more would
// leave the holder too little of its lease and is an error wrapping
// locker.ErrInvalidOption; what names the setting in it ("drift margin").
func (l Limits) Drift(what string, configured, ttl time.Duration) (time.Duration, error) {
	d := configured
	if d == 0 {
		d = DefaultDrift(ttl)
	}
	if d >= ttl/2 {
		return 0, fmt.Errorf("%w: %s: %s %v is not below half the TTL %v", locker.ErrInvalidOption, l.Backend, what, d, ttl)
	}
	return d, nil
}

// AtLeast reports d below floor as an error wrapping
// locker.ErrInvalidOption that names the setting: "retry interval must be
// at least 1ms, got 0s".
func (l Limits) AtLeast(what string, d, floor time.Duration) error {
	if d < floor {
		return fmt.Errorf("%w: %s: %s must be at least %v, got %v", locker.ErrInvalidOption, l.Backend, what, floor, d)
	}
	return nil
}

// Positive reports d ≤ 0 as an error wrapping locker.ErrInvalidOption.
func (l Limits) Positive(what string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: %s: %s must be positive, got %v", locker.ErrInvalidOption, l.Backend, what, d)
	}
	return nil
}

// NewOwner returns a random owner token of 128 bits in base64url (22
// characters, no ':' and no padding): no two holders, in any process, ever
// carry the same one, so a guarded release or renewal acts only for the
// holder that took the lock.
func NewOwner() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// MinLeft is the least of a lease of ttl that an acquisition must leave
// when its grant comes back: the lease runs from the moment the request
// was sent, so a grant that took longer (a slow server, a congested
// network) is nearly or already over, and a Handle of it would be lost at
// once. A backend gives such a grant back instead of handing it out. A
// tenth of the TTL, as Redlock's minimum validity.
func MinLeft(ttl time.Duration) time.Duration { return ttl / 10 }

// LateTries is how many grants in a row that came back too late (see
// LateGrant) a TryAcquire gives back before it fails; an Acquire tries
// again for as long as its ctx allows.
const LateTries = 3

// LateGrant is a grant that came back with less than MinLeft of its lease
// left, measured from the moment the acquiring request was sent, and was
// given back. It is a failure of the backend's speed, not a holder's:
// never locker.ErrNotAcquired.
type LateGrant struct {
	Backend string // "redis", "sqltable": names the backend in the message
	Server  string // what granted it: "the server", "the database"
	Took    time.Duration
	Left    time.Duration // of the lease, less the drift margin, when the grant came back
	TTL     time.Duration
}

func (e *LateGrant) Error() string {
	return fmt.Sprintf("%s: %s granted the lock after %v, leaving %v of its %v lease (at least %v needed): too slow for this TTL; the grant was given back",
		e.Backend, e.Server, e.Took.Round(time.Millisecond), max(e.Left, 0).Round(time.Millisecond), e.TTL, MinLeft(e.TTL))
}

// Late returns a *LateGrant if a grant whose request was sent at sent, for
// a lease of ttl with drift margin drift, has less than MinLeft(ttl) left
// now; nil if it may be handed out.
func Late(backend, server string, sent time.Time, ttl, drift time.Duration) error {
	left := time.Until(sent.Add(ttl - drift))
	if left >= MinLeft(ttl) {
		return nil
	}
	return &LateGrant{Backend: backend, Server: server, Took: time.Since(sent), Left: left, TTL: ttl}
}

// IsLate reports whether err is (or wraps) a LateGrant.
func IsLate(err error) bool {
	if err == nil {
		return false // without the heap allocation of e below
	}
	var e *LateGrant
	return errors.As(err, &e)
}
