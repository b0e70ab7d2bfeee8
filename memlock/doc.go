// Package memlock is the in-process backend of locker: the reference
// implementation of the whole contract, for tests, examples and programs that
// run as a single process.
//
// It is also meant to be read. Third-party backend authors can follow the
// same split: a server side (store.go: who holds which key, the lease timers,
// the queue of waiters, the fencing counter) and a client side (locker.go and
// handle.go: validating input, waiting with a context, renewing leases,
// reporting loss, Close).
//
// # Keyspaces
//
// A Store is one keyspace, the stand-in for a lock server. Lockers made from
// the same Store behave like separate processes sharing that server:
//
//	store := memlock.NewStore()
//	a, b := store.NewLocker(), store.NewLocker()
//
// New makes a Locker on a process-wide default Store.
//
// # URL form
//
// Importing the package registers the scheme mem for locker.Open:
//
//	mem://              the default Store (the one New uses)
//	mem://NAME          the process-wide Store called NAME (case-sensitive);
//	                    every Open of the same NAME shares its keys
//	mem://NAME?ttl=10s  ... with a default lease of 10s (WithDefaultTTL)
//
// ttl and token_base (WithTokenBase) are parameters every backend shares
// (see backend.Settings); of the others drift_margin, retry_interval and ddl are checked and
// change nothing here (one process: no clocks apart, waiters woken
// directly, no schema), and prefix (the store name is the keyspace) and
// watchdog=false (locks are always renewed) are refused. Any other query
// parameter, user information, port, path or fragment fails with an error
// wrapping locker.ErrInvalidURL. Named stores live as long as the
// process.
//
// # What it promises
//
//   - Exclusion: at most one holder per key at any moment. The Store decides
//     under one mutex, so no fault can break this.
//   - Fairness: waiters get a key in the order they started waiting. A release
//     or an expiry hands the key to the oldest waiter in the same step; waiters
//     are woken by a channel, never by polling.
//   - Leases: every lock has a TTL (locker.WithTTL per call, WithDefaultTTL per
//     Locker, else locker.DefaultTTL), within locker's portable range
//     [locker.MinTTL, locker.MaxTTL], as on every backend: outside it the
//     call fails with an error wrapping locker.ErrInvalidOption. The lease
//     is exactly the TTL, reported by Handle.TTL and by Inspect
//     (LockInfo.Lease). Inspect also reports the holder's
//     locker.WithOwner description (LockInfo.Owner), kept with the grant. Each Locker has one watchdog
//     goroutine that renews each of its leases every TTL/3 while it is held.
//     A lease that is not renewed runs out after its TTL, and a timer (not a
//     poll) then hands the key on.
//   - Loss: when a lease runs out, the Store closes the old holder's Done and
//     sets its Err to an error wrapping locker.ErrLost before the key goes to
//     anyone else. That ordering is strict here, because the store can reach
//     its holders in memory; a network backend must get the same effect with
//     a deadline of its own on the client side.
//   - Context: Acquire returns an error wrapping ctx.Err() when ctx ends; the
//     abandoned wait is removed from the queue, or, if the key was handed to it
//     at that moment, the key is passed straight on.
//   - Close releases every lock of the Locker at once (other Lockers' waiters
//     get the keys), ends its blocked Acquires with locker.ErrClosed, stops
//     its watchdog and returns only once it has stopped. Handles it held then
//     report locker.ErrReleasedByClose, which wraps locker.ErrReleased and
//     locker.ErrClosed.
//   - Locks are not reentrant: a Locker that Acquires a key it holds waits.
//
// # Fencing tokens
//
// Each Store has one counter, like etcd's store-wide revision; every grant of
// any key takes the next value, starting at 1. So the tokens of one key
// strictly increase across holders, including after a holder's lease expired,
// for as long as the Store exists, and the Store keeps nothing per key after
// the key is released. Tokens of different keys are distinct but otherwise
// unrelated; do not expect them to be consecutive.
//
// WithTokenBase(n) (token_base=n) adds n to every token a Locker hands out
// and reports (see locker.MaxTokenBase). The counter counts grants from 1,
// so it stays far below 2^62 (one grant a nanosecond for 146 years), and
// n + token, with n at most 2^62, fits an int64.
//
// # Failure modes
//
// Nothing fails on its own in memory, but a holder can still lose its lock: a
// process that stalls (a long GC pause, a stopped debugger, a saturated CPU)
// for longer than about 2/3 of the TTL misses its renewal, and the key may go
// to another holder. Its Done then closes; writes made after that must be
// rejected by the protected resource, using the token.
//
// A process that exits without Close loses its locks with it, which in
// memory means at once. Within a process, a Locker that is dropped without
// Close keeps its locks renewed by its watchdog forever: always Close Lockers.
//
// Keys are compared as Go strings, so distinct keys never share a lock.
// Key validation is locker.ValidateKey's.
//
// # Faults in tests
//
// The package's own tests inject faults through three unexported hooks, which
// its conformance test hands to conformance.Harness: steal (the Store takes a
// lock from its holder without telling it, which the holder's next renewal
// finds out), crash (the Locker dies
// without releasing; its locks stay until their leases run out) and cut (the
// Locker keeps running but cannot reach its Store until healed; its calls
// fail, its renewals fail, and its locks are lost when their leases run
// out; a Release fails but gives the lock up all the same, leaving its lease
// to run out). A backend for a real server gets the same effects by killing a client
// and by cutting its connection with a fault proxy, as the integration module's
// harnesses do (integration/redis, integration/postgres). memlock is built on the
// public package backend only, so a backend author can copy it.
//
// # At risk and logging
//
// A Handle is a locker.AtRisker, never at risk in a program: its renewals
// reach the Store in the same process. Only while cut off from its Store by
// the test hook (the conformance suite's partition) is a lock at risk, until
// a renewal succeeds again, so that code and tests written against memlock
// meet the interface as on the network backends. WithLogger logs those
// events and losses found at renewal.
package memlock
