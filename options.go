package locker

import (
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"
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

	// Owner is the holder's description given with WithOwner, or "" when
	// none was. A backend stores it with the lock where it can and returns
	// it in LockInfo.Owner; WithOwner checked it.
	Owner string
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

// MaxOwnerLen is the longest owner description WithOwner accepts, in bytes.
const MaxOwnerLen = 256

// WithOwner describes the holder of the lock this call takes, for operators
// asking who holds a key: a short free-form text such as
// "host=web-3 pid=4182 cmd=backup.sh", which the backend stores with the
// lock and its Inspect returns in LockInfo.Owner (the locker command's
// status prints it). It is a label, not an identity: nothing checks it,
// two holders may give the same one, and it plays no part in exclusion,
// Release or fencing.
//
// s must be valid UTF-8 of at most MaxOwnerLen bytes without control
// characters (no newline, tab or NUL: it is printed on one line); anything
// else is refused here, the same on every backend, with an error wrapping
// ErrInvalidOption, and the Acquire or TryAcquire given it takes nothing.
// An empty s means no description. Backends that cannot store it take the
// lock all the same and report an empty Owner; each backend's doc says
// which. The lock families (Semaphorer, ReadWriter) ignore it.
func WithOwner(s string) Option {
	return func(o *Options) error {
		if err := checkOwner(s); err != nil {
			return err
		}
		o.Owner = s
		return nil
	}
}

// checkOwner reports an owner description WithOwner must refuse.
func checkOwner(s string) error {
	if len(s) > MaxOwnerLen {
		return fmt.Errorf("%w: owner is %d bytes long, the limit is %d", ErrInvalidOption, len(s), MaxOwnerLen)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: owner %q is not valid UTF-8", ErrInvalidOption, s)
	}
	for i, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: owner %q has a control character (%U) at byte %d", ErrInvalidOption, s, r, i)
		}
	}
	return nil
}
