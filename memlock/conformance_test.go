package memlock

import (
	"testing"

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
		Steal:     func(t *testing.T, h locker.Handle) { store.steal(h.(*handle).g) },
		// One Store is one process's memory: children cannot share it.
		InProcess: true,
		URL:       "mem://conformance",
		// The store hands an expired key on by a timer, at the lease's end,
		// so the expiry bound needs only slack for a loaded machine. The
		// lease is the shortest of the portable range.
		TTL:         locker.MinTTL,
		ExpiryBound: 2 * locker.MinTTL,
	})
}
