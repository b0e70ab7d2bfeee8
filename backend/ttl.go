package backend

import (
	"fmt"
	"time"

	"github.com/go-locker/locker"
)

// CheckTTL reports a TTL outside the portable range [locker.MinTTL,
// locker.MaxTTL] as an error wrapping locker.ErrInvalidOption that names
// the range and the backend (name: "redis"), by locker.WithTTL's own
// check: a backend checks its Lockers' default TTL option (and URL
// parameter) with it, so that a TTL is refused or accepted the same on
// every backend, per call or per Locker.
func CheckTTL(name string, ttl time.Duration) error {
	if _, err := ApplyOptions(locker.WithTTL(ttl)); err != nil {
		return fmt.Errorf("%w: %s: TTL %v is outside the portable range [%v, %v]", locker.ErrInvalidOption, name, ttl, locker.MinTTL, locker.MaxTTL)
	}
	return nil
}
