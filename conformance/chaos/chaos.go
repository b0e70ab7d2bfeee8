package chaos

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// Harness tells Run how to exercise a backend under faults. As with
// conformance.Harness, the zero value of every optional field picks a
// default.
type Harness struct {
	// NewLocker returns the Locker of worker w. Without InProcess, Run calls
	// it in each worker process (the test binary started again, see Run),
	// whose environment holds the parent's plus what WorkerEnv returned for
	// that worker; so it must reach the backend from what the environment
	// says. Required.
	NewLocker func(t *testing.T, w Worker) locker.Locker

	// WorkerEnv, optional, runs in the test process before worker i starts
	// and returns environment entries ("NAME=value") for it, such as the
	// address of the fault proxy between that worker and the server (the
	// Link faults of a harness cut or slow it).
	WorkerEnv func(t *testing.T, worker int) []string

	// Faults are the harness's own faults: server pauses, kills and
	// restarts, partitions of one worker from the server. The nemesis
	// injects them, and the built-in holder pause (unless InProcess), in a
	// seeded random order. Optional.
	Faults []Fault

	// InProcess runs the workers as goroutines of the test process, for
	// backends that lock within one process (memlock); the holder pause,
	// which stops a worker's process, is then not among the faults.
	InProcess bool

	// NoHolderPause leaves the built-in holder pause out of the faults.
	NoHolderPause bool

	// Family is the lock family the workers take: the mutex (the zero
	// value), Semaphore(n) or ReadWrite(). Every worker's Locker must
	// implement the family's interface (locker.Semaphorer,
	// locker.ReadWriter), else Run fails at once. The faults are the same
	// for every family; the checks are the family's (see the package
	// documentation).
	Family Family

	// Workers is the number of workers, Keys the number of keys they
	// contend for (each hold is of a key drawn at random). Zero: 2 keys,
	// and 4 workers; for a semaphore of n, n+2 workers (at least 4), so
	// that the limit binds.
	Workers, Keys int

	// TTL is the lease the workers ask for (locker.WithTTL). Zero: 2s.
	TTL time.Duration

	// Duration is how long the workers run; faults are injected during all
	// but the last Settle of it. Zero: 30s. LOCKER_CHAOS_DURATION (a Go
	// duration), when set, overrides it: a soak lengthens every run.
	Duration time.Duration

	// Settle is the fault-free time at the end of the run, in which every
	// key must be taken again (a fault must not leave a key stuck). Zero:
	// 4 × TTL.
	Settle time.Duration

	// Seed seeds the nemesis. Zero: LOCKER_CHAOS_SEED when set, else a
	// random seed. Run logs it; the same seed replays the same faults in
	// the same order with the same durations (the interleaving of the
	// workers is up to the machine).
	Seed uint64

	// stopWithin bounds how long the workers may take to finish their holds
	// and stop at the end of the run; zero: 4 × TTL + 30s. The package's
	// own tests shorten it.
	stopWithin time.Duration
}

// Worker identifies a worker to Harness.NewLocker.
type Worker struct {
	Index int
	// Env returns the worker's environment variable name: the process's
	// own in a worker process; for InProcess workers the process's, with
	// what WorkerEnv returned for the worker on top.
	Env func(name string) string
}

// Fault is one kind of fault the nemesis can inject.
type Fault struct {
	// Name names the fault in logs and in the report ("server-pause",
	// "link-blackhole", ...).
	Name string

	// Inject starts the fault and returns the function that ends it. It
	// runs in the test process. target is the worker (and the lock it
	// holds, when it holds one) the nemesis aims at: a link fault should cut
	// that worker, a steal fault take that lock. Inject may fail t.
	Inject func(t *testing.T, target Target) (heal func())
}

// Target is the worker a fault is aimed at.
type Target struct {
	Worker int
	Key    string // the key it holds, "" if it holds none
	Token  int64
}

// Environment variables.
const (
	// EnvDuration lengthens (or shortens) a run: a Go duration.
	EnvDuration = "LOCKER_CHAOS_DURATION"
	// EnvSeed replays a run's faults: the seed a failed run logged.
	EnvSeed = "LOCKER_CHAOS_SEED"
)

func (h Harness) withDefaults(t *testing.T) Harness {
	if err := h.Family.validate(); err != nil {
		t.Fatal(err)
	}
	if h.Keys <= 0 {
		h.Keys = 2
	}
	if h.Workers <= 0 {
		h.Workers = 4
		if h.Family.kind == semaphoreFamily {
			h.Workers = max(4, h.Family.n+2)
		}
	}
	if h.TTL <= 0 {
		h.TTL = 2 * time.Second
	}
	if h.Duration <= 0 {
		h.Duration = 30 * time.Second
	}
	if v := os.Getenv(EnvDuration); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("chaos: %s=%q is not a positive Go duration", EnvDuration, v)
		}
		h.Duration = d
	}
	if h.Settle <= 0 {
		h.Settle = 4 * h.TTL
	}
	if h.Seed == 0 {
		if v := os.Getenv(EnvSeed); v != "" {
			s, err := strconv.ParseUint(v, 10, 64)
			if err != nil || s == 0 {
				t.Fatalf("chaos: %s=%q is not a positive integer", EnvSeed, v)
			}
			h.Seed = s
		} else {
			h.Seed = rand.Uint64() | 1
		}
	}
	return h
}

// Report is what a run did and found.
type Report struct {
	Family        string // the lock family the run exercised (Family.String)
	Seed          uint64
	Duration      time.Duration
	Workers, Keys int
	Acquired      int            // acquisitions that succeeded
	AcquireFailed int            // Acquire calls that returned an error
	AcquireErrors map[string]int // those errors by kind: "deadline" (a wait longer than 3 TTL + 2s), "stopped" (the run ended), "closed", "backend" (the backend failed the call: a server down, a link cut)
	ErrorSamples  []string       // the first few distinct "backend" errors, for the log
	Writes        int            // fenced writes the register accepted
	StaleRejected int            // fenced writes the register rejected: a newer token had written
	WriteErrors   int            // writes that failed (the register was busy)
	Evicted       int            // semaphore: writers the register cut off when n+1 claimed it (see Report.Violations for any not explained by a lost permit)
	Reads         int            // reader-writer: reads the register served
	StaleReads    int            // reader-writer: reads it refused (a writer with a newer token had written)
	LossReported  int            // handles that reported the loss of their lock
	Faults        map[string]int // faults injected, by kind
	Violations    []string       // broken promises: must be none
	Linearizable  bool           // porcupine's verdict on the register history

	// Holds and Injected are the run's history, for checks of a harness's
	// own (what a backend promises beyond the contract under a fault of
	// its test bed): every successful acquisition, and every fault with
	// the time it was in place.
	Holds    []Hold
	Injected []Injected
}

// Hold is one successful acquisition of a run, with what became of it.
// Times are when the worker observed them.
type Hold struct {
	Worker   int
	Key      string
	Mode     string // "" for the mutex; "permit" (a semaphore); "read" or "write" (reader-writer)
	Token    int64
	Invoked  time.Time // Acquire was called
	Acquired time.Time // Acquire returned the lock
	Lost     time.Time // Done closed with an error wrapping ErrLost; zero: never
	Released time.Time // Release was called; zero: never
	// ReleaseErr is Release's error ("" when it returned nil).
	ReleaseErr string
}

// Injected is one fault of a run: in place from Start (Inject returned)
// to End (its heal was called).
type Injected struct {
	Name       string
	Target     Target
	Start, End time.Time
}

// String is the report on one line, for logs and for CHAOS.md.
func (r *Report) String() string {
	fam := ""
	switch {
	case strings.HasPrefix(r.Family, "semaphore"):
		fam = fmt.Sprintf("family=%s evicted=%d ", r.Family, r.Evicted)
	case r.Family == "read-write":
		fam = fmt.Sprintf("family=%s reads=%d stale-reads=%d ", r.Family, r.Reads, r.StaleReads)
	}
	return fmt.Sprintf("%sseed=%d duration=%v workers=%d keys=%d acquired=%d acquire-errors=%d%v writes=%d stale-rejected=%d write-errors=%d losses-reported=%d faults=%v linearizable=%v violations=%d",
		fam, r.Seed, r.Duration.Round(time.Second), r.Workers, r.Keys, r.Acquired, r.AcquireFailed, errKinds(r.AcquireErrors), r.Writes, r.StaleRejected, r.WriteErrors, r.LossReported, r.Faults, r.Linearizable, len(r.Violations))
}

func errKinds(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	return " " + fmt.Sprint(m)
}
