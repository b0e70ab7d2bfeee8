// Package chaos runs a backend under faults and checks what happened, the
// way Jepsen tests lock services, on one machine. Third-party backends run
// it the same way as conformance.Run.
//
// Run starts workers, each in its own OS process (the test binary run again
// with -test.run selecting the calling test, so NewLocker runs there too),
// or, with Harness.InProcess, as goroutines. Each worker loops: acquire a
// random key of the run, write to a shared register a few times under it,
// passing its fencing token, read the register, release. Some holds last
// longer than the TTL, so renewal is exercised. The register is a real
// resource: an SQLite row per key that rejects, in the same statement, a
// write whose token is lower than the highest it has accepted. Every
// operation is recorded with its invocation and completion time. Workers
// keep writing after their lock was lost, as a program that does not check
// would: fencing must stop those writes, and the checks must see them.
//
// Meanwhile a nemesis injects faults: after a quiet spell of 0.5–1.5 TTL, a
// fault for 1–3 TTL, chosen at random among Harness.Faults and the built-in
// holder pause (SIGSTOP of the process of a worker that holds a lock, then
// SIGCONT: a GC pause, swap or a frozen VM past the lease). The harness's
// faults are its test bed's: pausing, killing and restarting the server,
// cutting or slowing one worker's link through a fault proxy. The nemesis
// draws from a seed that Run logs; LOCKER_CHAOS_SEED replays the same faults
// in the same order and for the same durations (which lock a fault hits
// depends on how the workers interleave). The last Settle of the run, at
// least, is fault-free: it starts when the last fault's heal returned.
//
// Timestamps are the machine's wall clock, which every process shares; a
// clock step during a run (an NTP correction) would skew the checks.
//
// The checks on the history:
//   - fencing tokens are unique per key, and a hold acquired after another
//     hold's acquisition completed has the larger token;
//   - one holder at a time: no worker acquires a key while another worker's
//     hold of it is in use (between its Acquire's return and its Release
//     call) unless that holder had been told of the loss by then (Done
//     closed with an error wrapping locker.ErrLost), or its process was
//     stopped within a TTL before: a frozen process cannot be told anything,
//     which is the case fencing tokens are for;
//   - a holder whose lock was taken over, or whose writes the register
//     rejected, was told so: Done closed with ErrLost, or Release returned
//     it;
//   - the register never accepted a write with a token below one it had
//     accepted before, and its history is linearizable (checked with
//     github.com/anishathalye/porcupine; a verdict porcupine does not reach
//     within a minute, possible on long soaks, is logged, not failed);
//   - every key was acquired again after the last fault ended;
//   - every worker finished its hold and stopped when asked, and Done closed
//     by the time Release returned: no call hung.
//
// Run fails the test for every violation, logs a report (operations,
// faults by kind, stale writes rejected, losses reported) and, on failure,
// writes the history as JSON lines and porcupine's HTML visualisation (with
// holds, losses and faults drawn in) to the test's artifact directory (kept
// with go test -artifacts DIR).
//
// A run lasts Harness.Duration (default 30s); LOCKER_CHAOS_DURATION
// overrides it, for a soak (make chaos in the repository does this on every
// backend):
//
//	LOCKER_CHAOS_DURATION=10m go test -run Chaos ./...
package chaos
