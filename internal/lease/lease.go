// Package lease holds the lease arithmetic that the lease-based backends
// (redis, redis/redlock, sqltable) share: the bounds of a TTL, the drift
// margin by which a holder gives a lock up before its lease may have run
// out on the server, and the TTL of one call from its options. The
// messages name the backend, so a user sees which Locker refused.
package lease

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"time"

	"github.com/go-locker/locker"
)

// Limits are a backend's bounds on a lease.
type Limits struct {
	Backend  string // names the backend in errors: "redis"
	Min, Max time.Duration
}

// Check reports a TTL outside the limits as an error wrapping
// locker.ErrInvalidOption.
func (l Limits) Check(ttl time.Duration) error {
	if ttl < l.Min {
		return fmt.Errorf("%w: %s: TTL %v is below the minimum of %v", locker.ErrInvalidOption, l.Backend, ttl, l.Min)
	}
	if l.Max > 0 && ttl > l.Max {
		return fmt.Errorf("%w: %s: TTL %v is above the maximum of %v", locker.ErrInvalidOption, l.Backend, ttl, l.Max)
	}
	return nil
}

// TTL returns the lease of one call: the per-call locker.WithTTL if opts
// has one (checked against the limits), else def.
func (l Limits) TTL(def time.Duration, opts []locker.Option) (time.Duration, error) {
	o, err := locker.ApplyOptions(opts...)
	if err != nil {
		return 0, err
	}
	if o.TTL == 0 {
		return def, nil
	}
	if err := l.Check(o.TTL); err != nil {
		return 0, err
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
