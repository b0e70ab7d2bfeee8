package locker

import (
	"fmt"
	"time"
)

// Options are the per-call settings of Acquire and TryAcquire. Backends read
// them with backend.ApplyOptions; the zero value of each field means "the backend's
// default".
type Options struct {
	// TTL is the lease: how long the lock outlives a holder that stops renewing
	// it (crash, pause, partition). Zero means no WithTTL was given, and the
	// backend uses its default; WithTTL itself rejects zero and negative
	// values. Backends reject a TTL outside their own range with an error
	// wrapping ErrInvalidOption (or clamp it, where documented). Backends
	// without leases (PostgreSQL advisory locks end with the session) document
	// how they treat it.
	TTL time.Duration
}

// Option sets one per-call option. An Option reports an invalid value as an
// error wrapping ErrInvalidOption.
type Option func(*Options) error

// WithTTL sets the lease of the lock. It must be positive; backends reject
// values below their own minimum with an error wrapping ErrInvalidOption, or,
// where they document it, raise them to the minimum.
func WithTTL(ttl time.Duration) Option {
	return func(o *Options) error {
		if ttl <= 0 {
			return fmt.Errorf("%w: TTL must be positive, got %v", ErrInvalidOption, ttl)
		}
		o.TTL = ttl
		return nil
	}
}
