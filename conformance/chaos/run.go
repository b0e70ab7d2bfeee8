package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Run runs workers against the backend h describes while a nemesis injects
// faults, then checks the recorded history. It fails t for every violation
// and returns the report (nil in a worker process). See the package
// documentation.
func Run(t *testing.T, h Harness) *Report {
	t.Helper()
	if h.NewLocker == nil {
		t.Fatal("chaos: Harness.NewLocker is required")
	}
	r := exercise(t, h)
	if r == nil {
		return nil // a worker process
	}
	t.Logf("chaos report: %v", r)
	if !r.Linearizable && len(r.Violations) == 0 {
		t.Logf("chaos: porcupine reached no verdict on the register history within a minute (not a failure; the direct stale-write check passed)")
	}
	for _, e := range r.ErrorSamples {
		t.Logf("chaos: an Acquire error under the faults: %s", e)
	}
	for _, v := range r.Violations {
		t.Error(v)
	}
	if len(r.Violations) > 0 {
		t.Errorf("chaos: %d violations; replay the faults with %s=%d", len(r.Violations), EnvSeed, r.Seed)
	}
	return r
}

// faultRec is one injected fault, in place from start to end.
type faultRec struct {
	name       string
	target     Target
	start, end int64
}

// exercise is Run without failing t for violations, for the package's own
// tests of the checks. In a worker process it works and returns nil.
func exercise(t *testing.T, h Harness) *Report {
	if isWorkerProcess(t) {
		runWorkerProcess(t, h.withDefaults(t))
		return nil
	}
	return run(t, h.withDefaults(t))
}

func run(t *testing.T, h Harness) *Report {
	t.Logf("chaos: seed %d (set %s=%d to replay these faults); %v, %d workers, %d keys, TTL %v, %v",
		h.Seed, EnvSeed, h.Seed, h.Family, h.Workers, h.Keys, h.TTL, h.Duration)
	dir := t.TempDir()
	regPath := filepath.Join(dir, "register.db")
	reg, err := openRegister(regPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.close() }) // after the workers' cleanup below
	rng := rand.New(rand.NewPCG(h.Seed, 0))
	runID := strconv.FormatUint(rng.Uint64()>>16, 36) + strconv.FormatInt(time.Now().UnixNano()%1e6, 36)

	rec := newRecorder(h.Workers)
	ws := make([]*workerProc, h.Workers)
	// Also when the run fails half-way (a WorkerEnv, a worker's start or a
	// fault's Inject fails t): no worker may outlive the test, nor stay
	// stopped.
	t.Cleanup(func() {
		for _, w := range ws {
			if w != nil {
				w.stop()
			}
		}
		for _, w := range ws {
			if w != nil {
				w.kill()
			}
		}
	})
	for i := range ws {
		var env []string
		if h.WorkerEnv != nil {
			env = h.WorkerEnv(t, i)
		}
		c := workConfig{index: i, run: runID, keys: h.Keys, ttl: h.TTL, seed: rng.Uint64(), family: h.Family}
		if h.InProcess {
			ws[i] = startInProcess(t, h, c, env, reg, rec)
		} else {
			ws[i] = startProcess(t, c, env, regPath, rec)
		}
	}

	faults := slices.Clone(h.Faults)
	if !h.InProcess && !h.NoHolderPause {
		faults = append(faults, Fault{Name: "holder-pause", Inject: func(t *testing.T, tg Target) func() {
			return ws[tg.Worker].freeze(rec)
		}})
	}
	start := time.Now()
	faultEnd := start.Add(h.Duration - h.Settle)
	var injected []faultRec
	if len(faults) > 0 {
		injected = nemesis(t, rng, h, faults, rec, faultEnd)
	}
	// The last heal may have taken a while (a restarted server must answer
	// first): the fault-free time is Settle from its end at least.
	settleStart := now()
	end := start.Add(h.Duration)
	if e := time.Unix(0, settleStart).Add(h.Settle); e.After(end) {
		end = e
	}
	time.Sleep(time.Until(end))
	stopWithin := 4*h.TTL + 30*time.Second
	if h.stopWithin > 0 {
		stopWithin = h.stopWithin
	}
	stopBy := time.Now().Add(stopWithin)
	var hung []string
	for _, w := range ws {
		w.stop()
	}
	for i, w := range ws {
		if !w.wait(time.Until(stopBy)) {
			hung = append(hung, fmt.Sprintf("worker %d did not finish its hold and stop within %v of being asked to (a call that does not return); %s", i, stopWithin, w.dumpGoroutines(t)))
			w.kill()
		}
	}

	r := &Report{Family: h.Family.String(), Seed: h.Seed, Duration: time.Since(start), Workers: h.Workers, Keys: h.Keys, Faults: map[string]int{}}
	for _, f := range injected {
		r.Faults[f.name]++
		r.Injected = append(r.Injected, Injected{Name: f.name, Target: f.target, Start: time.Unix(0, f.start), End: time.Unix(0, f.end)})
	}
	events := rec.all()
	keys := make([]string, h.Keys)
	for i := range keys {
		keys[i] = workConfig{run: runID}.key(i)
	}
	check(r, history{family: h.Family, events: events, freezes: rec.freezes(), faults: injected, ttl: h.TTL, keys: keys, settleStart: settleStart, settle: h.Settle})
	r.Violations = append(r.Violations, hung...)
	r.Violations = append(r.Violations, rec.errs()...)
	if len(r.Violations) > 0 || !r.Linearizable {
		writeArtifacts(t, h.Family, events, injected, r)
	}
	return r
}

// nemesis injects faults until end: a quiet spell of 0.5–1.5 TTL, then a
// fault for 1–3 TTL, aimed at a worker that holds a lock when one does. A
// fault that would run past end is cut short to end, if that leaves it a
// TTL at least: a short run (a fault window of 4 TTL) drew a first spell
// and fault too long for it about one time in sixteen, and injected none.
func nemesis(t *testing.T, rng *rand.Rand, h Harness, faults []Fault, rec *recorder, end time.Time) []faultRec {
	var out []faultRec
	jitter := func(lo, hi float64) time.Duration {
		return time.Duration((lo + (hi-lo)*rng.Float64()) * float64(h.TTL))
	}
	for {
		quiet, dur := jitter(0.5, 1.5), jitter(1, 3)
		f := faults[rng.IntN(len(faults))]
		pick := rng.Uint64()
		if left := time.Until(end) - quiet; dur > left {
			if left < h.TTL {
				return out
			}
			dur = left
		}
		time.Sleep(quiet)
		tg := rec.target(pick)
		t.Logf("chaos: %s on worker %d (holding %q token %d) for %v", f.Name, tg.Worker, tg.Key, tg.Token, dur.Round(time.Millisecond))
		heal := f.Inject(t, tg)
		fr := faultRec{name: f.Name, target: tg, start: now()}
		time.Sleep(dur)
		fr.end = now()
		if heal != nil {
			heal()
		}
		out = append(out, fr)
	}
}

// recorder collects the workers' events and knows who holds what now.
type recorder struct {
	mu      sync.Mutex
	events  []event
	holding []*event // by worker: its current hold's acquire event
	frozen  [][2]int64
	frozenW []int
	errList []string
}

func newRecorder(workers int) *recorder { return &recorder{holding: make([]*event, workers)} }

func (r *recorder) add(e event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	if e.W < 0 || e.W >= len(r.holding) {
		r.errList = append(r.errList, fmt.Sprintf("chaos: an event names worker %d, which does not exist", e.W))
		return
	}
	switch {
	case e.Op == opAcquire && e.OK:
		r.holding[e.W] = &e
	case e.Op == opRelease:
		r.holding[e.W] = nil
	}
}

func (r *recorder) addErr(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errList = append(r.errList, s)
}

// target picks, by pick, a worker that holds a lock, or any worker.
func (r *recorder) target(pick uint64) Target {
	r.mu.Lock()
	defer r.mu.Unlock()
	var holders []int
	for w, e := range r.holding {
		if e != nil {
			holders = append(holders, w)
		}
	}
	if len(holders) == 0 {
		return Target{Worker: int(pick % uint64(len(r.holding)))}
	}
	w := holders[pick%uint64(len(holders))]
	return Target{Worker: w, Key: r.holding[w].Key, Token: r.holding[w].Tok}
}

func (r *recorder) addFreeze(w int, from, to int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.frozen = append(r.frozen, [2]int64{from, to})
	r.frozenW = append(r.frozenW, w)
}

func (r *recorder) freezes() map[int][][2]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := map[int][][2]int64{}
	for i, w := range r.frozenW {
		m[w] = append(m[w], r.frozen[i])
	}
	return m
}

func (r *recorder) all() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

func (r *recorder) errs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.errList)
}

// workerProc is a running worker: a process, or goroutines.
type workerProc struct {
	index  int
	cmd    *exec.Cmd
	stdin  interface{ Close() error }
	cancel context.CancelFunc
	done   chan struct{}
	stderr *tailBuffer // a worker process's stderr, also copied to the test's

	// startErr says why a worker process ended before it was ready; set
	// before ready is closed.
	startErr string
}

func (w *workerProc) stop() {
	if w.cancel != nil {
		w.cancel()
	}
	if w.stdin != nil {
		_ = w.stdin.Close()
	}
}

func (w *workerProc) wait(d time.Duration) bool {
	select {
	case <-w.done:
		return true
	case <-time.After(max(d, 0)):
		return false
	}
}

// dumpGoroutines says where a hung worker is stuck: a worker process gets
// SIGQUIT (the Go runtime prints every goroutine to its stderr and exits),
// and the end of its stderr is returned; for goroutine workers, the test
// process's goroutines.
func (w *workerProc) dumpGoroutines(t *testing.T) string {
	if w.cmd != nil && w.cmd.Process != nil {
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		_ = w.cmd.Process.Signal(syscall.SIGQUIT)
		if !w.wait(10 * time.Second) {
			return "it did not end on SIGQUIT within 10s either"
		}
		return "its goroutines at SIGQUIT (the end of its stderr):\n" + w.stderr.String()
	}
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) || len(buf) >= 64<<20 {
			return "the test process's goroutines:\n" + string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b = append(b.b, p...)
	if over := len(b.b) - b.max; over > 0 {
		b.b = append(b.b[:0], b.b[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.b)
}

// kill ends the worker: a process is let go on (if stopped) and killed; a
// goroutine worker, already told to stop, is waited for, boundedly.
func (w *workerProc) kill() {
	if w.cmd != nil && w.cmd.Process != nil {
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		_ = w.cmd.Process.Kill()
		<-w.done
		return
	}
	select {
	case <-w.done:
	case <-time.After(30 * time.Second):
	}
}

// freeze stops the worker's process (SIGSTOP), as a long GC pause, swap or
// a frozen VM would, and returns the function that lets it go on.
func (w *workerProc) freeze(rec *recorder) func() {
	from := now()
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		rec.addErr(fmt.Sprintf("chaos: SIGSTOP worker %d: %v", w.index, err))
		return nil
	}
	return func() {
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		rec.addFreeze(w.index, from, now())
	}
}

func startInProcess(t *testing.T, h Harness, c workConfig, env []string, reg *register, rec *recorder) *workerProc {
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	lookup := func(name string) string {
		if v, ok := vars[name]; ok {
			return v
		}
		return os.Getenv(name)
	}
	l := h.NewLocker(t, Worker{Index: c.index, Env: lookup})
	vs, err := c.family.views(l)
	if err != nil {
		_ = l.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &workerProc{index: c.index, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer l.Close()
		work(ctx, vs, reg, c, rec.add)
	}()
	return w
}

func startProcess(t *testing.T, c workConfig, env []string, regPath string, rec *recorder) *workerProc {
	var pat []string
	for _, part := range strings.Split(t.Name(), "/") {
		pat = append(pat, "^"+regexp.QuoteMeta(part)+"$")
	}
	cmd := exec.Command(os.Args[0], "-test.run="+strings.Join(pat, "/"), "-test.count=1", "-test.timeout=2h")
	cmd.Env = append(os.Environ(), env...)
	cmd.Env = append(cmd.Env,
		envWorker+"="+strconv.Itoa(c.index),
		envRun+"="+t.Name(),
		envRunID+"="+c.run,
		envRegister+"="+regPath,
		envKeys+"="+strconv.Itoa(c.keys),
		envTTL+"="+c.ttl.String(),
		envSeed+"="+strconv.FormatUint(c.seed, 10),
		envFamily+"="+c.family.String(),
	)
	stderr := &tailBuffer{max: 256 << 10}
	cmd.Stderr = io.MultiWriter(os.Stderr, stderr)
	killWithParent(cmd) // a stopped worker cannot see its stdin close
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("chaos: start worker %d: %v", c.index, err)
	}
	w := &workerProc{index: c.index, cmd: cmd, stdin: stdin, done: make(chan struct{}), stderr: stderr}
	ready := make(chan struct{})
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var other []string
		isReady := false
		for sc.Scan() {
			line := sc.Text()
			if b, ok := strings.CutPrefix(line, eventPrefix); ok {
				var e event
				if err := json.Unmarshal([]byte(b), &e); err != nil {
					rec.addErr(fmt.Sprintf("chaos: worker %d printed a bad event %q: %v", c.index, b, err))
					continue
				}
				rec.add(e)
				continue
			}
			if line == readyLine && !isReady {
				isReady = true
				close(ready)
				continue
			}
			if len(other) < 200 {
				other = append(other, line)
			}
		}
		if err := sc.Err(); err != nil {
			rec.addErr(fmt.Sprintf("chaos: reading worker %d's events: %v", c.index, err))
			_ = cmd.Process.Kill() // it may be blocked writing to the pipe
		}
		err := cmd.Wait()
		if !isReady {
			w.startErr = fmt.Sprintf("chaos: worker %d ended with %v before it was ready; its output:\n%s", c.index, err, strings.Join(other, "\n"))
			close(ready)
		}
		if err != nil || !isReady || slices.ContainsFunc(other, func(s string) bool { return strings.HasPrefix(s, "--- FAIL") }) {
			if !w.killed() {
				rec.addErr(fmt.Sprintf("chaos: worker %d ended with %v; its output:\n%s", c.index, err, strings.Join(other, "\n")))
			}
		}
	}()
	select {
	case <-ready:
		if w.startErr != "" {
			t.Fatal(w.startErr) // a Locker without the run's family, a NewLocker that failed: no run
		}
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		<-w.done
		t.Fatalf("chaos: worker %d did not start within 2 minutes", c.index)
	}
	return w
}

// killed reports whether the run killed the worker (a hang already
// reported); its exit status then says nothing more.
func (w *workerProc) killed() bool {
	return w.cmd != nil && w.cmd.ProcessState != nil && !w.cmd.ProcessState.Exited()
}
