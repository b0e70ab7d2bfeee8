package benchmark

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Instructions is what RunInstructions needs: the sides, and how a child
// process reaches the servers the parent uses.
type Instructions struct {
	// Sides: the first is the one under test; each other side's count is
	// reported over it as first/other-instr.
	Sides []Side
	// Env is added to a child's environment so that its sides reach the
	// same servers as the parent's (for example the integration tests'
	// LOCKER_TEST_REDIS_ADDR naming the container the parent started): a
	// child must start no server of its own, whose start-up would be
	// counted.
	Env []string
	// Settle, if set, is how long a child idles after its warm-up, before
	// it warms up again and counts: for a client that takes another path
	// for a while after a slow request (the redis Locker runs requests off
	// the caller's goroutine for 10s after one that took 75ms), since under
	// callgrind the first requests are that slow (code is translated when
	// it first runs).
	Settle time.Duration
	// Cycles is how many more Lock+release cycles the long run of a side
	// makes than its short run (default 200); Runs is how many times each
	// side's pair of runs is repeated, the median reported (the larger of
	// two; default 3).
	Cycles, Runs int
}

// EnvCallgrindDir, when set, is a directory where RunInstructions keeps
// callgrind's profile of each child (callgrind.<side>.<cycles>.out, the
// last run's), for callgrind_annotate: where a side's instructions go.
const EnvCallgrindDir = "LOCKER_BENCH_CALLGRIND_DIR"

// envInstrChild names, in a child of RunInstructions, the side to run and
// its number of cycles ("cycles:name").
const envInstrChild = "LOCKER_BENCH_INSTRUCTIONS_CHILD"

// RunInstructions counts the instructions the client side executes for
// one uncontended Lock+release cycle of each side: the figure that shows
// a client-side cost (allocations, encoding, bookkeeping, goroutines)
// whatever the machine's load and the loopback's speed, unlike a time. For
// each side it runs the test binary again under valgrind's callgrind
// (which counts every instruction of the process, user space only), once
// making the warm-up and 20 cycles and once 20+Cycles, and reports the
// difference over Cycles: the process's start, the side's set-up and the
// warm-up cancel out. The runs of the sides are interleaved, one of each
// side in turn. A child runs with GOMAXPROCS=1 (fewer idle threads
// spinning for work, whose instructions depend on timing). It reports
// <side>-instr/op, the spread of the runs (<side>-instr-spread: the
// largest over the smallest) and first/other-instr.
//
// It skips when valgrind is not installed. A run takes a minute or more
// (callgrind runs the client some 50 times slower); it counts once,
// whatever b.N (a call with a larger b.N reports the first call's counts):
//
//	go test -run '^$' -bench '^BenchmarkInstructions$' ./redis
func RunInstructions(b *testing.B, in Instructions) {
	if v := os.Getenv(envInstrChild); v != "" {
		instrChild(b, in, v)
		return
	}
	if len(in.Sides) == 0 {
		b.Fatal("benchmark.RunInstructions: no sides")
	}
	valgrind, err := exec.LookPath("valgrind")
	if err != nil {
		b.Skip("benchmark.RunInstructions: valgrind is not installed (apt-get install valgrind)")
	}
	if in.Cycles <= 0 {
		in.Cycles = 200
	}
	if in.Runs <= 0 {
		in.Runs = 3
	}
	if b.N > 1 {
		// The testing package calls a benchmark again with a larger b.N
		// when asked for more than one iteration: the counts do not
		// depend on it, so the first call's stand.
		if ms, ok := counted.Load(b.Name()); ok {
			for _, m := range ms.([]metric) {
				b.ReportMetric(m.v, m.unit)
			}
			return
		}
	}
	const short = 20
	per := make([][]float64, len(in.Sides))
	for range in.Runs {
		for i, s := range in.Sides {
			lo, err := countInstructions(b, valgrind, in.Env, s.Name, short)
			if err != nil {
				b.Fatalf("%s, %d cycles: %v", s.Name, short, err)
			}
			hi, err := countInstructions(b, valgrind, in.Env, s.Name, short+in.Cycles)
			if err != nil {
				b.Fatalf("%s, %d cycles: %v", s.Name, short+in.Cycles, err)
			}
			per[i] = append(per[i], float64(hi-lo)/float64(in.Cycles))
		}
	}
	var ms []metric
	med := make([]float64, len(in.Sides))
	for i, s := range in.Sides {
		slices.Sort(per[i])
		med[i] = per[i][len(per[i])/2]
		ms = append(ms, metric{med[i], s.Name + "-instr/op"})
		if per[i][0] > 0 {
			ms = append(ms, metric{per[i][len(per[i])-1] / per[i][0], s.Name + "-instr-spread"})
		}
	}
	for i, s := range in.Sides[1:] {
		if med[i+1] > 0 {
			ms = append(ms, metric{med[0] / med[i+1], in.Sides[0].Name + "/" + s.Name + "-instr"})
		}
	}
	counted.Store(b.Name(), ms)
	for _, m := range ms {
		b.ReportMetric(m.v, m.unit)
	}
}

// counted keeps each RunInstructions benchmark's metrics by name, for the
// calls with a larger b.N.
var counted sync.Map

type metric struct {
	v    float64
	unit string
}

var collected = regexp.MustCompile(`Collected : (\d+)`)

// countInstructions runs the test binary under callgrind as a child that
// makes cycles cycles of side, and returns the instructions it executed.
func countInstructions(b *testing.B, valgrind string, env []string, side string, cycles int) (int64, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	outFile := "/dev/null"
	if dir := os.Getenv(EnvCallgrindDir); dir != "" {
		outFile = filepath.Join(dir, fmt.Sprintf("callgrind.%s.%d.out", strings.NewReplacer("/", "_", " ", "_").Replace(side), cycles))
	}
	cmd := exec.Command(valgrind, "--tool=callgrind", "--callgrind-out-file="+outFile,
		exe, "-test.run", "^$", "-test.bench", benchPattern(b.Name()), "-test.benchtime", "1x")
	cmd.Env = append(append(os.Environ(), env...), envInstrChild+"="+strconv.Itoa(cycles)+":"+side, "GOMAXPROCS=1", "GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("%v\n%s", err, tail(out))
	}
	m := collected.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no instruction count in valgrind's output:\n%s", tail(out))
	}
	if !strings.Contains(string(out), "\nPASS") && !strings.HasPrefix(string(out), "PASS") {
		return 0, fmt.Errorf("the child did not pass:\n%s", tail(out))
	}
	return strconv.ParseInt(string(m[1]), 10, 64)
}

// benchPattern is the -test.bench pattern that selects the benchmark
// named name (a path of sub-benchmark names) and nothing else.
func benchPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// tail is the end of a child's output, or where it panicked.
func tail(out []byte) string {
	const max = 4000
	s := string(out)
	for _, mark := range []string{"panic: ", "fatal error: ", "SIGSEGV", "SIGILL"} {
		if i := strings.Index(s, mark); i >= 0 {
			s = s[i:]
			break
		}
	}
	if len(s) > max {
		s = s[:max]
	}
	return s
}

// instrChild is RunInstructions in the child: the warm-up and the cycles
// of one side.
func instrChild(b *testing.B, in Instructions, v string) {
	n, name, ok := strings.Cut(v, ":")
	cycles, err := strconv.Atoi(n)
	if !ok || err != nil {
		b.Fatalf("benchmark.RunInstructions: bad %s %q", envInstrChild, v)
	}
	i := slices.IndexFunc(in.Sides, func(s Side) bool { return s.Name == name })
	if i < 0 {
		b.Fatalf("benchmark.RunInstructions: no side %q", name)
	}
	ctx := context.Background()
	lock := in.Sides[i].New(b, Key(b, name), 0)
	// The cycle bare: no clock read, no release deadline (whose timer
	// would count for every side).
	cycle := func() error {
		release, err := lock(ctx)
		if err != nil {
			return err
		}
		return release(ctx)
	}
	warm := func() {
		for range 3 {
			if err := cycle(); err != nil {
				b.Fatalf("%s: warm-up: %v", name, err)
			}
		}
	}
	warm()
	if in.Settle > 0 {
		time.Sleep(in.Settle)
		warm()
	}
	for range cycles {
		if err := cycle(); err != nil {
			b.Fatalf("%s: %v", name, err)
		}
	}
}
