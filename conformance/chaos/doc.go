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
//   - every key a worker asked for after the last fault ended was acquired
//     then (workers pick keys at random: a key nobody asked for says nothing);
//   - every worker finished its hold and stopped when asked, and Done closed
//     by the time Release returned: no call hung.
//
// # Lock families
//
// Harness.Family picks what the workers take: the mutex (the zero value),
// Semaphore(n), a permit of a semaphore of n per hold, or ReadWrite(),
// a read lock per hold or, one hold in four, the write lock. One field
// with three values rather than a flag per family: a run exercises one
// family, a harness cannot ask for two at once, and a backend's test bed
// (its faults, its WorkerEnv) serves every family unchanged, so wiring a
// backend's family run is the one line that sets Family. Every worker's
// Locker must implement the family's interface (locker.Semaphorer,
// locker.ReadWriter); Run fails at once, naming it, when one does not.
// The faults are the same as the mutex's: the harness's and the holder
// pause.
//
// A semaphore's holder writes 1–3 times and then leaves the register; its
// register (one per key) keeps the writers that have written and not left,
// at most n, and a floor. A write of a writer is accepted; a write at or
// below the floor is refused; a new token joins while fewer than n write.
// When n+1 tokens claim it, one of them has lost its permit, and the
// lowest of the n+1 is cut off for good (the floor rises to it). So the
// register never accepts more than n writers at once ("never more than n
// accepted writers per fence window"), and a writer cut off never writes
// again. Tokens alone cannot tell which of n+1 claimants is the stale one:
// a live holder can be cut off in place of a stale one with a higher token
// (a permit taken over and given again while an older permit is still in
// use); that is the limit of fencing a semaphore by tokens, and the
// checks do not count it against the backend. For n = 1 it is the mutex's
// register with holders that leave.
//
// A reader-writer hold is fenced both ways: a writer writes 1–3 times and
// reads, with its token; a reader reads 1–3 times, with its token. Readers
// and writers draw tokens from one sequence (a later grant, a higher
// token), so the register serves a read only if no writer with a token
// above the reader's has written, and accepts a write only if no read or
// write with a higher token came before. A stale read is one a reader
// makes after a writer granted after it has written: it would see a value
// its lock did not protect, or the value change under it. The register
// refuses it, and the checks hold it to that: a served read never returns
// a value written by a token above the reader's, one reader's reads all
// return the same value, and a hold refused a read or a write must have
// been told of the loss of its lock.
//
// The checks of a family run are the mutex's, with the limit in place of
// mutual exclusion:
//   - tokens are unique per key and grow with real time, across permits,
//     readers and writers (so a writer's token is above every token
//     acquired before it);
//   - at every acquisition, the holds of the key in use that had not been
//     told of a loss (and whose process was not stopped within a TTL) are
//     no more than n permits, or readers only, or one writer alone; when
//     only stopped holders make too many, one of them must report the loss
//     at some time;
//   - semaphore: whenever the register found n+1 writers at once, one of
//     them had lost its permit (told, or stopped); the register never
//     accepted more than n writers at once nor a writer it had cut off,
//     and its history is linearizable;
//   - reader-writer: the register accepted no write older than a write or
//     read before it and served no read older than a write before it, and
//     its history is linearizable; a refused hold reported its loss;
//   - every key asked for after the last fault ended was acquired then, and no call
//     hung.
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
