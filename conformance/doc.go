// Package conformance is the test suite that every locker backend must pass,
// ours and third parties' alike, in the manner of testing/fstest.TestFS and
// golang.org/x/net/nettest.TestConn.
//
// A backend's test calls Run with a Harness that makes independent clients of
// a real server, and optionally hooks that inject faults:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Harness{
//			NewLocker: func(t *testing.T) locker.Locker { return mybackend.New(newClient(t)) },
//			Crash:     func(t *testing.T, l locker.Locker) { ... },
//			Cut:       func(t *testing.T, l locker.Locker) (heal func()) { ... },
//			TTL:       time.Second,
//		})
//	}
//
// The cases run in a fixed order under names of the form Area/Case
// (Acquire/MutualExclusion, Release/NotOwner, Fencing/AfterCrash,
// Loss/DoneOnCut, Context/CancelWhileWaiting, Keys/Unusual, ...), so that
// -run can select them. Each case uses keys unique to it, bounds every wait
// it makes, and has a deadline of its own: a backend that deadlocks makes the
// case fail with a dump of every goroutine instead of hanging the binary.
// Cases whose hooks the Harness lacks are skipped with a message saying which
// hook would enable them.
//
// The fault hooks are Crash (a client dies without releasing), Cut (a client
// is partitioned from the server) and Steal (the server takes a lock away from
// a holder that does not know). The Process cases run the test binary again as
// a child process that holds a key, so a backend that locks only within its
// process fails them (memlock says so with Harness.InProcess). Harness.URL
// turns on the checks of the backend's URL opener. Harness.Skip names known,
// tracked failures, which are reported as skipped, never as passed.
//
// The TTL cases hold every backend to locker's one TTL contract (see
// locker.MinTTL): the shortest, the longest and a between TTL of the
// portable range work, a lock without WithTTL has locker.DefaultTTL, each
// Handle.TTL (and LockInfo.Lease, where Inspect can tell) is exactly the TTL
// asked unless the harness declares what the server imposes
// (Harness.LeaseGrain, LeaseFloor, LeaseCeiling), and a silent holder's lock
// is gone within the lease reported plus Harness.ExpirySlack.
//
// Run must not run in parallel with other tests of the same binary: its
// goroutine-leak check looks at the whole process.
//
// The suite depends only on the standard library, the root package and
// go.uber.org/goleak, so importing it costs a backend author little.
package conformance
