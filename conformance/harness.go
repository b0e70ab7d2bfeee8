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
	// its locks stay on the backend until their lease or session expires
	// (for a session backend, closing l's connections under it is a crash:
	// the server ends the session). The suite still calls l.Close at the end
	// of the case, which must then return without hanging. For a server
	// backend the public way is to give each client its own path to the
	// server through a fault proxy and close that path for good.
	// Optional: without it Fencing/AfterCrash, Release/StopsRenewal,
	// Steal/RenewalDoesNotExtend and Waiters/WaiterCrashes skip.
	Crash func(t *testing.T, l locker.Locker)

	// Cut cuts l off from the backend while l keeps running, as a partition
	// does: every request hangs (a blackhole, not a refused connection), and
	// the server hears nothing from l. For a session backend the server keeps
	// l's session (and its locks) until the session's own timeout. heal undoes
	// the cut; the suite calls it at most once. Optional: without it the
	// Loss/*, Release/AfterLoss, Release/NotOwner, Release/WhileCut,
	// Context/*WhileCut, Close/WhileInFlight and Waiters/WaiterCut cases skip.
	Cut func(t *testing.T, l locker.Locker) (heal func())

	// Reset closes every connection l has to the backend at once, from
	// outside, as a server dropping its clients, an idle-connection killer,
	// a pooler or an operator's kill would; new connections are accepted at
	// once. For a client behind a fault proxy, that is the proxy's reset of
	// all its connections. Optional: without it Loss/ConnectionsReset skips.
	Reset func(t *testing.T, l locker.Locker)

	// ResetEndsLocks, when set, says why the backend's locks end on the
	// server the moment their holder's connection does (a PostgreSQL
	// session advisory lock lives as long as its session). A Reset then
	// frees them at the instant the holder's connection breaks, and the
	// holder hears of it from that same break: its notice cannot come
	// before another client can acquire, only just after (a wake-up on a
	// loaded machine can take milliseconds). Loss/ConnectionsReset then
	// holds a lock that another client took to its loss reported within a
	// quarter of a second after that (a wake-up, not a check on a timer),
	// and the next holder's token to be greater. Empty: a lock survives a
	// reset, or is reported lost no later than another client can take its
	// key.
	ResetEndsLocks string

	// Steal takes h's lock away on the server without telling its holder,
	// as an eviction, a failover or an operator would: delete or overwrite
	// the lock (Redis: DEL of the lock key; PostgreSQL: terminate the
	// holder's session from another connection; ZooKeeper: delete the node;
	// etcd: delete the key or revoke the lease; a lock table: expire the row).
	// Afterwards another client must be able to acquire the key at once,
	// and h's holder must neither release nor renew the new holder's lock.
	// Optional: without it the Steal/* cases skip.
	Steal func(t *testing.T, h locker.Handle)

	// LossBound is how soon after Steal the robbed holder must report the
	// loss (Done closed, Err wrapping ErrLost). For a lease backend it is
	// about one renewal interval plus a round trip; for a session backend,
	// how soon it notices its session has ended. Zero: TTL.
	LossBound time.Duration

	// InProcess says the backend locks within one OS process only, by design
	// (memlock): the Process/* cases, which hold a key in a child process,
	// skip. A backend for more than one process must leave it false.
	InProcess bool

	// CtxSlack is how late a call may return after its context ended (or
	// after Close, for a call Close interrupts): Context/*, Release/WhileCut
	// and Close/WhileInFlight fail a call that returns later. Zero: 500ms.
	CtxSlack time.Duration

	// URL, when set, is a URL that locker.Open turns into a working Locker of
	// the backend (its package imported for the registration). The Open/*
	// cases check the opener's contract on it: an unknown query parameter
	// is rejected with an error wrapping locker.ErrInvalidURL, and a
	// password in the URL appears in no error. Optional: without it the
	// Open/* cases skip.
	URL string

	// NewLockerWithTokenBase returns a new client like NewLocker's, on the
	// same keyspace, whose tokens have the token base n (the backend's
	// WithTokenBase; see locker.MaxTokenBase), or the error with which the
	// backend refused n. A Locker with base 0 has no base. Optional:
	// without it Fencing/TokenBase opens URL with the shared parameter
	// token_base=n, and without either it skips.
	NewLockerWithTokenBase func(t *testing.T, n int64) (locker.Locker, error)

	// TTL is the lease the suite asks for with locker.WithTTL in the expiry,
	// crash, cut and steal cases. Zero: 2s.
	TTL time.Duration

	// ExpiryBound is how long after Crash or Cut (or after a child process
	// that held the key was killed) the key must become acquirable by another
	// client. Zero: 3 × TTL.
	ExpiryBound time.Duration

	// The lease rule (see locker.MinTTL): a backend gives the TTL asked, or
	// the nearest safe lease, and reports it in Handle.TTL. The TTL/* cases
	// hold every handle's TTL to exactly the lease these fields predict
	// from the TTL asked: the TTL rounded down to LeaseGrain, at most
	// LeaseCeiling, at least LeaseFloor. All zero (the default): exactly
	// the TTL asked. Set one only for what the server imposes, and say
	// where you set it which server setting it comes from.
	//
	// LeaseGrain is the unit the server counts leases in (etcd: a second).
	LeaseGrain time.Duration
	// LeaseFloor is the server's shortest lease, given in place of a
	// shorter TTL because the server cannot go lower (etcd's minimum lease,
	// ZooKeeper's minSessionTimeout).
	LeaseFloor time.Duration
	// LeaseCeiling is the server's longest lease, given in place of a
	// longer TTL (ZooKeeper's maxSessionTimeout).
	LeaseCeiling time.Duration

	// NoInspectLease says why the backend's Inspect cannot tell the full
	// lease of a holder (LockInfo.Lease), when it cannot: the suite then
	// checks that Lease is 0, as LockInfo documents. Empty: Lease must
	// equal the holder's Handle.TTL.
	NoInspectLease string

	// NoOwner says why the backend's Inspect cannot report the holder's
	// description given with locker.WithOwner (LockInfo.Owner), when it
	// cannot: Inspect/Owner then skips. Empty: Inspect must report it.
	NoOwner string

	// ExpirySlack is how long, beyond the lease its Handle reported, the
	// lock of a holder that went silent (Cut, else Crash) may still keep
	// another client from acquiring the key: the server's expiry
	// granularity and the waiter's wake-up. TTL/SilentHolder holds the
	// backend to it. Zero: 1s.
	ExpirySlack time.Duration

	// ManyKeys is how many keys one Locker holds at once in Keys/ManyHeld.
	// Zero: 2000. Backends that pin a connection per lock set it lower.
	ManyKeys int

	// Contenders is how many Lockers Acquire/MutualExclusion and
	// TryAcquire/Burst run, each with Goroutines goroutines.
	// Zero: 4 Lockers × 4 goroutines.
	Contenders, Goroutines int

	// HandoffBound is how soon after a release a waiting Acquire must hold
	// the lock, as the median of a few handoffs (so one slow handoff on a
	// loaded machine is forgiven); Waiters/* hold each handoff to it too. A
	// backend that waits by notification
	// needs about one round trip; the bound catches waiters that sleep
	// between attempts or until the holder's lease runs out. Zero: 1s.
	HandoffBound time.Duration

	// CaseTimeout is the deadline of each case; a case that deadlocks fails
	// when it passes instead of hanging the test binary (a case still
	// running 30s later aborts the binary with a dump of every goroutine).
	// Zero: the larger of 60s and 4 × ExpiryBound + 4 × TTL (those two
	// after their own defaults), so that slow-expiry backends get time for
	// the cases that wait out several expiries.
	CaseTimeout time.Duration

	// SkipLeakCheck turns off the goroutine-leak check after Close, for
	// backends whose client library keeps process-wide goroutines that the
	// Locker does not own. Say why where you set it.
	SkipLeakCheck bool

	// Only, if set, limits the run to these areas ("Acquire") and cases
	// ("Area/Case"); the others are not run (nor reported). It is for a
	// second run of the suite over a variation of a backend whose full run
	// is made elsewhere (over TLS, as a least-privileged user), to keep a
	// test run's time in bounds; LOCKER_CONFORMANCE_FULL=1 runs everything
	// anyway. Names that are no area or case of the suite fail the run.
	Only []string

	// Skip names cases (as "Area/Case") that this run skips, each with the
	// reason, which the skip message shows: a known failure of the backend
	// that is tracked and being fixed, never a way to pass. A skipped case
	// is reported as skipped, not passed. Names that are no case of the
	// suite fail the run, so a renamed case cannot silently run again.
	Skip map[string]string

	// Unsafe lists configurations of the backend that would break a rule of
	// the contract if accepted: an evicting Redis, a temporary SQL schema, one
	// server listed twice among Redlock's nodes, a session the server grants
	// far shorter than asked. Config/UnsafeRefused checks that each is refused
	// with an error wrapping locker.ErrUnsafeConfig, or, where the entry says
	// MadeSafe, that the rule it threatens holds all the same. Optional:
	// without entries the case skips.
	Unsafe []UnsafeConfig

	// IgnoreGoroutines lists functions whose goroutines the leak check
	// ignores when the function is anywhere in their stack (see
	// goleak.IgnoreAnyFunction): for client libraries' own, and for test
	// infrastructure the harness runs in process, such as a fault proxy
	// whose connections wind down after the case.
	IgnoreGoroutines []string
}

// UnsafeConfig is one configuration a backend must refuse, or make safe (see
// Harness.Unsafe).
type UnsafeConfig struct {
	// Name says what is unsafe; it names the subtest: "maxmemory-policy=allkeys-lru".
	Name string

	// New builds a Locker in that configuration, the way a user would (a
	// constructor, or Open with a URL), and returns it or the error with which
	// the backend refused it. The suite closes a Locker it gets. For a
	// MadeSafe entry, each call must return an independent client (like
	// Harness.NewLocker) that Harness.Cut can cut off.
	New func(t *testing.T) (locker.Locker, error)

	// Mention is text the refusal must contain, case-insensitively: the
	// option, parameter or server setting it names ("maxmemory-policy",
	// "lock_table"). Empty: no text is required.
	Mention string

	// MadeSafe says the backend accepts the configuration and makes it safe
	// instead of refusing it. The suite then checks the rule a "far shorter
	// session than asked" threatens: a holder cut off from the backend
	// reports its loss (Done closed, Err wrapping locker.ErrLost) before
	// another client of the same configuration holds the key, and the next
	// holder's token is greater. It needs Harness.Cut.
	MadeSafe bool
}
