package locker

import (
	"fmt"
	"time"
)

// Options are the per-call settings of Acquire and TryAcquire. Backends read
// them with backend.ApplyOptions; the zero value of each field means "the backend's
// default".
type Options struct {
	// TTL is the lease: the longest the lock outlives a holder that stops
	// renewing it (crash, pause, partition). Zero means no WithTTL was given,
	// and the backend uses its Locker's default (DefaultTTL unless the
	// Locker was configured otherwise). Otherwise it is within [MinTTL,
	// MaxTTL]: WithTTL refuses anything else. A backend gives this lease, or
	// the nearest safe one by the rule stated at MinTTL, and reports it in
	// Handle.TTL.
	TTL time.Duration
}

// Option sets one per-call option. An Option reports an invalid value as an
// error wrapping ErrInvalidOption.
type Option func(*Options) error

// WithTTL sets the lease of the lock: the longest the lock may outlive its
// holder once the holder goes silent (stops renewing, is partitioned, or
// crashes), on every backend. While the holder lives and reaches the
// backend, the lock is renewed and held until Release.
//
// Every backend accepts every ttl in [MinTTL, MaxTTL]. A ttl outside that
// range is refused here, the same on every backend: the Acquire or
// TryAcquire given it fails with an error wrapping ErrInvalidOption that
// names the range, and takes nothing. Where a backend cannot give exactly
// ttl it gives the nearest safe lease (the rule is stated at MinTTL) and
// reports it in Handle.TTL.
func WithTTL(ttl time.Duration) Option {
	return func(o *Options) error {
		if err := checkTTL(ttl); err != nil {
			return err
		}
		o.TTL = ttl
		return nil
	}
}

// checkTTL reports a TTL outside the portable range [MinTTL, MaxTTL] as an
// error wrapping ErrInvalidOption that names the range; nil otherwise.
// Backends check their Lockers' default TTL options with backend.CheckTTL,
// which is this, so that a TTL means the same everywhere.
func checkTTL(ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL {
		return fmt.Errorf("%w: TTL %v is outside the portable range [%v, %v]", ErrInvalidOption, ttl, MinTTL, MaxTTL)
	}
	return nil
}
