package conformance

import (
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// Harness tells Run how to exercise a backend. It is a struct so that fields
// can be added without breaking anyone; the zero value of every optional field
// turns the cases that need it off (they are skipped, visibly) or picks a
// default.
type Harness struct {
	// NewLocker returns a new, independent client of the backend under test:
	// each call behaves like another process sharing one keyspace. Required.
	// The suite closes what it gets; NewLocker may also register t.Cleanup.
	NewLocker func(t *testing.T) locker.Locker

	// Crash makes l die without releasing anything, as a process killed with
	// SIGKILL would: it stops renewing and stops talking to the backend, but
	// its locks stay on the backend until their lease or session expires.
	// Optional: without it the Fencing/AfterCrash case skips.
	Crash func(t *testing.T, l locker.Locker)

	// Cut cuts l off from the backend while l keeps running (a partition:
	// requests hang or fail). heal undoes the cut. Optional: without it the
	// Loss cases and the Release cases that need a lost lock skip.
	Cut func(t *testing.T, l locker.Locker) (heal func())

	// TTL is the lease the suite asks for with locker.WithTTL in the expiry,
	// crash and cut cases. Zero: 2s.
	TTL time.Duration

	// ExpiryBound is how long after Crash or Cut the key must become
	// acquirable by another client. Zero: 3 × TTL.
	ExpiryBound time.Duration

	// MinTTL is the smallest TTL the backend accepts; the suite checks that a
	// TTL below it is rejected with locker.ErrInvalidOption (or, with
	// ClampsTTL, accepted). Zero: the backend has no minimum above zero.
	MinTTL time.Duration

	// ClampsTTL says the backend documents that a TTL below MinTTL is raised
	// to MinTTL instead of rejected.
	ClampsTTL bool

	// NoTTL says the backend has no leases (locks end with the holder's
	// session, as with PostgreSQL advisory locks): WithTTL is validated but
	// the "renewal keeps the lock past its TTL" case is skipped.
	NoTTL bool

	// ManyKeys is how many keys one Locker holds at once in Keys/ManyHeld.
	// Zero: 2000. Backends that pin a connection per lock set it lower.
	ManyKeys int

	// Contenders is how many Lockers the exclusion case runs, each with
	// Goroutines goroutines. Zero: 4 Lockers × 4 goroutines.
	Contenders, Goroutines int

	// HandoffBound is how soon after a release a waiting Acquire must hold
	// the lock, as the median of a few handoffs (so one slow handoff on a
	// loaded machine is forgiven). A backend that waits by notification
	// needs about one round trip; the bound catches waiters that sleep
	// between attempts or until the holder's lease runs out. Zero: 1s.
	HandoffBound time.Duration

	// CaseTimeout is the deadline of each case; a case that deadlocks fails
	// when it passes instead of hanging the test binary. Zero: 60s.
	CaseTimeout time.Duration

	// SkipLeakCheck turns off the goroutine-leak check after Close, for
	// backends whose client library keeps process-wide goroutines that the
	// Locker does not own. Say why where you set it.
	SkipLeakCheck bool

	// IgnoreGoroutines lists top functions of goroutines that the leak check
	// ignores (see goleak.IgnoreTopFunction), for client libraries' own.
	IgnoreGoroutines []string
}
