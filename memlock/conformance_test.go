//go:build conformance_pending

package memlock

import (
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
)

// TestConformance runs the shared suite on memlock. Every Locker of the run
// shares one Store, like clients of one server.
func TestConformance(t *testing.T) {
	store := NewStore()
	conformance.Run(t, conformance.Harness{
		NewLocker: func(t *testing.T) locker.Locker { return store.NewLocker() },
		Crash:     func(t *testing.T, l locker.Locker) { l.(*Locker).crash() },
		Cut:       func(t *testing.T, l locker.Locker) func() { return l.(*Locker).cut() },
		// Short leases keep the expiry cases fast; the store hands an expired
		// key on by a timer, so a little slack over the TTL is enough.
		TTL:         200 * time.Millisecond,
		ExpiryBound: 1 * time.Second,
		MinTTL:      MinTTL,
	})
}
