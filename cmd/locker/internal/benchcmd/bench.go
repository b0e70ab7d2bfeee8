package benchcmd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/cmd/locker/internal/cli"
	"github.com/go-locker/locker/conformance/benchmark"
)

type benchOpts struct {
	url      string
	ops      int
	handoffs int
	waiters  []int
	clients  int
	duration time.Duration
	ttl      time.Duration
	timeout  time.Duration
	prefix   string
	plot     string
	metrics  string
}

// Limits on the flags, so that a typo does not open a thousand connections.
const (
	maxBenchClients = 1024
	maxBenchOps     = 10_000_000
)

// Command is "locker bench": it measures a backend and plots the latency
// distributions. It lives in a package of its own, linked only into
// locker-full, so that its dependencies (gonum/plot and its fonts, the
// progress bar) cost the start of locker run nothing.
func Command() *cobra.Command {
	o := benchOpts{}
	cmd := &cobra.Command{
		Use:   "bench [--url URL] [flags]",
		Short: "Measure lock latency, handoff and fairness on your own backend",
		Long: `Bench measures the backend named by --url through the library's public API,
the calls every program that uses locker makes (locker.Open, Acquire,
Release, Close), each client on a Locker of its own as if it were another
process. It runs these cases, one after another, on keys of its own:

  uncontended   one client takes and releases a free key --ops times;
                latency is Acquire plus Release.
  handoff/W     W+1 clients on one key (one for each --waiters value): the
                holder waits until the W others are inside Acquire, then
                releases; latency is from the start of its Release to the
                return of the next holder's Acquire, --handoffs times. The
                client that released waits for the next holder before it
                asks again, so every handoff goes to another client.
  contended     --clients clients take and release one key as fast as they
                can for --duration; latency is the wait in Acquire, ops/s
                the acquisitions per second, share each client's part of
                them (min and max; with N clients a fair backend gives each
                1/N).

Progress goes to stderr (a bar on a terminal, plain lines otherwise), the
table of latency percentiles, ops/s and shares to stdout, and with --plot a
picture of the latency distributions to a PNG or SVG file: for each case
the share of operations that took at most x (the body), and on a log scale
the share that took at least x (the tail).

With --metrics, every Locker of the run is wrapped by package observe
(github.com/go-locker/locker/observe), and its OpenTelemetry metrics
(locker.acquire.duration, locker.hold.duration, locker.releases,
locker.losses, ...) are written at the end to a JSON file: an array of one
OpenTelemetry ResourceMetrics per case, the case named by the resource
attribute locker.bench.case, in the SDK's data model as the stdoutmetric
exporter prints it. They count every acquisition, also those the table
does not (each client's first, which readies its connection, and those
between cases' phases). The wrapper adds a little to each call.

Keys are under --prefix followed by a random run id (printed on stderr), so
the run never touches anyone else's keys; every lock is released and every
Locker closed at the end, also on error or interrupt. Backends that keep a
released key's record for its fencing token (the SQL lock table) keep one
row per case, freed by their usual pruning.

Exit status: 0 when every case ran; 125 on bad flags, a bad or unreachable
URL, or a backend error during the run; 128+N when signal N interrupted it.

Without --url and $LOCKER_URL, the backend is ` + strings.TrimSuffix(cli.DefaultURLHelp(), ",") + ".",
		Example: `  # The local default (an SQLite file in your cache directory).
  locker bench

  # Your Redis, longer runs, with a plot of the latency distributions.
  locker bench --url redis://redis:6379 --ops 5000 --duration 30s --plot redis.png

  # Fairness across 32 clients only: no handoff cases, one uncontended op.
  locker bench --url etcd://etcd:2379 --ops 1 --waiters '' --clients 32

  # The OpenTelemetry metrics of package observe, as JSON.
  locker bench --metrics metrics.json && jq '.[].Resource' metrics.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBench(cmd.Context(), o, os.Stdout, os.Stderr)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.url, "url", "", "backend URL (default $LOCKER_URL, else the SQLite database of locker run)")
	f.IntVar(&o.ops, "ops", 1000, "uncontended Acquire+Release pairs")
	f.IntVar(&o.handoffs, "handoffs", 200, "handoffs measured for each --waiters value")
	o.waiters = []int{1, 8, 64}
	f.Var((*intList)(&o.waiters), "waiters", "waiter counts of the handoff cases, comma-separated ('' for none)")
	f.IntVar(&o.clients, "clients", 8, "clients of the contended case (0 to skip it)")
	f.DurationVar(&o.duration, "duration", 5*time.Second, "how long the contended case runs")
	f.DurationVar(&o.ttl, "ttl", 0, "lease of the locks (default: the backend's)")
	f.DurationVar(&o.timeout, "timeout", 10*time.Second, "bound on each call to a free key, each Release and each handoff; past it the run fails")
	f.StringVar(&o.prefix, "prefix", "locker-bench/", "prefix of the keys; a random run id and the case name follow it")
	f.StringVar(&o.plot, "plot", "", "write the latency distributions to this .png or .svg file")
	f.StringVar(&o.metrics, "metrics", "", "record the run's OpenTelemetry metrics (package observe) and write them to this JSON file")
	return cmd
}

func (o *benchOpts) validate() error {
	switch {
	case o.ops < 1 || o.ops > maxBenchOps:
		return fmt.Errorf("--ops %d: want 1 to %d", o.ops, maxBenchOps)
	case o.handoffs < 1 || o.handoffs > maxBenchOps:
		return fmt.Errorf("--handoffs %d: want 1 to %d", o.handoffs, maxBenchOps)
	case o.clients < 0 || o.clients == 1 || o.clients > maxBenchClients:
		return fmt.Errorf("--clients %d: want 2 to %d, or 0 to skip the contended case", o.clients, maxBenchClients)
	case o.duration <= 0:
		return fmt.Errorf("--duration %v: want a positive duration", o.duration)
	case o.ttl < 0:
		return fmt.Errorf("--ttl %v is negative", o.ttl)
	case o.timeout <= 0:
		return fmt.Errorf("--timeout %v: want a positive duration", o.timeout)
	case o.prefix == "":
		return errors.New("--prefix is empty: the run's keys need a prefix of their own")
	}
	for _, w := range o.waiters {
		if w < 1 || w >= maxBenchClients {
			return fmt.Errorf("--waiters %d: want 1 to %d", w, maxBenchClients-1)
		}
	}
	if o.plot != "" {
		if _, err := plotFormat(o.plot); err != nil {
			return err
		}
	}
	return nil
}

// signalError is the cause of a run ended by a signal.
type signalError struct{ s syscall.Signal }

func (e signalError) Error() string { return "interrupted by " + e.s.String() }

// bencher runs the cases against one backend.
type bencher struct {
	o      benchOpts
	url    string // the URL to open
	shown  string // the URL with its password hidden
	prefix string // o.prefix + run id + "/"
	opts   []locker.Option
	prog   *progress
	// metrics records each case's Lockers for --metrics; nil without it.
	metrics *benchMetrics

	announced bool // the run's first line has been printed
}

func runBench(ctx context.Context, o benchOpts, stdout, stderr io.Writer) (err error) {
	if err := o.validate(); err != nil {
		return cli.Fail(cli.ExitFailure, "%v", err)
	}
	if ctx == nil {
		ctx = context.Background()
	}
	u, err := cli.BackendURL(o.url)
	if err != nil {
		return cli.Fail(cli.ExitFailure, "%v", err)
	}
	// The picture and the metrics go to temporary files beside --plot and
	// --metrics (see outFile).
	var plotFile, metricsFile *outFile
	if o.plot != "" {
		if plotFile, err = createOut("--plot", o.plot); err != nil {
			return err
		}
		defer plotFile.discard()
	}
	if o.metrics != "" {
		if metricsFile, err = createOut("--metrics", o.metrics); err != nil {
			return err
		}
		defer metricsFile.discard()
	}
	// A signal ends the run; the cases release their locks and close their
	// Lockers on the way out.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	go func() {
		select {
		case s := <-sigs:
			cancel(signalError{s.(syscall.Signal)})
		case <-ctx.Done():
		}
	}()

	id := make([]byte, 4)
	_, _ = rand.Read(id)
	b := &bencher{o: o, url: u, shown: cli.RedactURL(u), prefix: o.prefix + hex.EncodeToString(id) + "/", prog: newProgress(stderr)}
	if metricsFile != nil {
		b.metrics = &benchMetrics{run: hex.EncodeToString(id)}
	}
	if o.ttl > 0 {
		b.opts = append(b.opts, locker.WithTTL(o.ttl))
	}

	results, err := b.run(ctx)
	if err != nil {
		var sig signalError
		if errors.As(context.Cause(ctx), &sig) {
			return cli.Fail(128+int(sig.s), "bench interrupted by %v; its locks were released", sig.s)
		}
		return cli.Fail(cli.ExitFailure, "%v", err)
	}
	if err := printBench(stdout, results); err != nil {
		return cli.Fail(cli.ExitFailure, "writing the table: %v", err)
	}
	if plotFile != nil {
		if err := writePlot(plotFile.f, o.plot, "locker bench: "+b.shown, results); err != nil {
			return cli.Fail(cli.ExitFailure, "--plot: %v", err)
		}
		if err := plotFile.commit(); err != nil {
			return err
		}
		b.prog.say("latency distributions written to %s", o.plot)
	}
	if metricsFile != nil {
		if err := b.metrics.write(ctx, metricsFile.f); err != nil {
			return cli.Fail(cli.ExitFailure, "--metrics: %v", err)
		}
		if err := metricsFile.commit(); err != nil {
			return err
		}
		b.prog.say("metrics written to %s", o.metrics)
	}
	return nil
}

// outFile is a file written at the end of a successful run: a temporary
// file beside path, created before the run so that a bad path fails at
// once rather than after the run, and renamed onto path when complete, so
// that a failed run leaves no file, nor harms an older one.
type outFile struct {
	flag, path string
	f          *os.File
}

func createOut(flag, path string) (*outFile, error) {
	f, err := os.CreateTemp(filepath.Dir(path), ".locker-bench-*"+filepath.Ext(path))
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, cli.Fail(cli.ExitFailure, "%s %s: cannot write in %s: %v", flag, path, filepath.Dir(path), err)
	}
	return &outFile{flag: flag, path: path, f: f}, nil
}

// commit closes the file and renames it onto its path.
func (o *outFile) commit() error {
	err := o.f.Close()
	if err == nil {
		err = os.Chmod(o.f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(o.f.Name(), o.path)
	}
	if err != nil {
		return cli.Fail(cli.ExitFailure, "%s: %v", o.flag, err)
	}
	return nil
}

// discard removes the temporary file unless commit renamed it.
func (o *outFile) discard() {
	o.f.Close()
	os.Remove(o.f.Name()) // fails once renamed
}

// run runs every case in turn.
func (b *bencher) run(ctx context.Context) ([]*caseResult, error) {
	var results []*caseResult
	r, err := b.uncontended(ctx)
	if err != nil {
		return nil, err
	}
	results = append(results, r)
	for _, w := range b.o.waiters {
		r, err := b.handoff(ctx, w)
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	if b.o.clients > 0 {
		r, err := b.contended(ctx, b.o.clients)
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	return results, nil
}

// open opens n Lockers for the case name, each taking and releasing key
// once so that its connections and the backend's schema are ready before
// the measuring starts. On error it closes what it opened.
func (b *bencher) open(ctx context.Context, n int, name, key string) (ls []locker.Locker, err error) {
	defer func() {
		if err != nil {
			closeAll(ls)
			ls = nil
		}
	}()
	for range n {
		var l locker.Locker
		if b.metrics != nil {
			l, err = b.metrics.open(ctx, name, b.url)
		} else {
			l, err = locker.Open(ctx, b.url)
		}
		if err != nil {
			return ls, err
		}
		ls = append(ls, l)
		if err := b.acquireRelease(ctx, l, key); err != nil {
			return ls, fmt.Errorf("%s: %w", b.shown, err)
		}
		if !b.announced {
			// Said once the backend has answered, so that a bad URL
			// gets one line of its own.
			b.announced = true
			b.prog.say("benchmarking %s; keys under %q", b.shown, b.prefix)
		}
	}
	return ls, nil
}

// acquireRelease takes key and releases it, each call bounded by --timeout.
func (b *bencher) acquireRelease(ctx context.Context, l locker.Locker, key string) error {
	actx, cancel := context.WithTimeoutCause(ctx, b.o.timeout, errBenchTimeout)
	h, err := l.Acquire(actx, key, b.opts...)
	timedOut := errors.Is(context.Cause(actx), errBenchTimeout)
	cancel()
	if err != nil {
		if timedOut && !strings.Contains(err.Error(), errBenchTimeout.Error()) {
			err = fmt.Errorf("%w (%v %v: is the backend reachable?)", err, errBenchTimeout, b.o.timeout)
		}
		return err
	}
	return b.release(h)
}

var errBenchTimeout = errors.New("no answer within --timeout")

// release releases h within --timeout, whatever became of the run's ctx.
func (b *bencher) release(h locker.Handle) error {
	ctx, cancel := context.WithTimeout(context.Background(), b.o.timeout)
	defer cancel()
	return h.Release(ctx)
}

func closeAll(ls []locker.Locker) error {
	var errs []error
	for _, l := range ls {
		errs = append(errs, l.Close())
	}
	return errors.Join(errs...)
}

// closeLockers closes ls and, when the case had no error of its own,
// returns the first Close error.
func closeLockers(ls []locker.Locker, err *error) {
	if cerr := closeAll(ls); cerr != nil && *err == nil {
		*err = fmt.Errorf("closing the Lockers: %w", cerr)
	}
}

func (b *bencher) uncontended(ctx context.Context) (_ *caseResult, err error) {
	key := b.prefix + "uncontended"
	ls, err := b.open(ctx, 1, "uncontended", key)
	if err != nil {
		return nil, err
	}
	defer closeLockers(ls, &err)
	l := ls[0]
	r := &caseResult{name: "uncontended", what: "Acquire+Release, free key", clients: 1, ops: b.o.ops}
	r.lat = make([]time.Duration, 0, b.o.ops)
	task := b.prog.count("uncontended", int64(b.o.ops), "ops")
	defer task.end()
	start := time.Now()
	for range b.o.ops {
		t0 := time.Now()
		if err := b.acquireRelease(ctx, l, key); err != nil {
			return nil, err
		}
		r.lat = append(r.lat, time.Since(t0))
		task.add(1)
	}
	r.elapsed = time.Since(start)
	slices.Sort(r.lat)
	task.done(fmt.Sprintf("%d ops in %v", b.o.ops, r.elapsed.Round(time.Millisecond)))
	return r, nil
}

// group is the case's clients on key as a benchmark.Group, each Acquire
// with --ttl, each release bounded by --timeout, every counted acquisition
// shown on task.
func (b *bencher) group(mode benchmark.Mode, ls []locker.Locker, key string, task *task) *benchmark.Group {
	locks := make([]benchmark.Lock, len(ls))
	for i, l := range ls {
		locks[i] = benchmark.LockOf(l, key, b.opts...)
	}
	g := benchmark.NewGroup(mode, locks)
	g.ReleaseTimeout = b.o.timeout
	g.OnCount = func() { task.add(1) }
	return g
}

// handoff runs W+1 clients on one key: the holder waits until the W others
// are inside Acquire, then releases; the client that released waits for
// the next holder before it asks again (benchmark.Handoff).
func (b *bencher) handoff(ctx context.Context, w int) (_ *caseResult, err error) {
	name := fmt.Sprintf("handoff/%d", w)
	key := b.prefix + fmt.Sprintf("handoff-%d", w)
	ls, err := b.open(ctx, w+1, name, key)
	if err != nil {
		return nil, err
	}
	defer closeLockers(ls, &err)
	task := b.prog.count(name, int64(b.o.handoffs), "handoffs")
	defer task.end()

	g := b.group(benchmark.Handoff, ls, key, task)
	// Some client must take the lock within --timeout of the last
	// acquisition, or the case fails instead of hanging.
	g.Stall = b.o.timeout
	start := time.Now()
	err = g.Phase(ctx, b.o.handoffs)
	g.Stop()
	elapsed := time.Since(start)
	if err != nil {
		return nil, fmt.Errorf("%s on %q (--timeout %v): %w", name, key, b.o.timeout, err)
	}
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	slices.Sort(g.Handoffs)
	task.done(fmt.Sprintf("%d handoffs in %v", len(g.Handoffs), elapsed.Round(time.Millisecond)))
	return &caseResult{name: name, what: fmt.Sprintf("Release to next Acquire, %d waiting", w), clients: w + 1,
		lat: g.Handoffs, elapsed: elapsed, ops: len(g.Handoffs), share: g.Counts}, nil
}

// contended runs n clients that take and release one key as fast as they
// can for --duration (benchmark.Contended); latency is the wait in Acquire.
func (b *bencher) contended(ctx context.Context, n int) (_ *caseResult, err error) {
	name := "contended"
	key := b.prefix + "contended"
	ls, err := b.open(ctx, n, fmt.Sprintf("%s/%d", name, n), key)
	if err != nil {
		return nil, err
	}
	defer closeLockers(ls, &err)
	task := b.prog.timed(name, b.o.duration)
	defer task.end()

	g := b.group(benchmark.Contended, ls, key, task)
	cctx, cancel := context.WithTimeout(ctx, b.o.duration)
	defer cancel()
	start := time.Now()
	err = g.Phase(cctx, 0)
	g.Stop()
	elapsed := time.Since(start)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	r := &caseResult{name: fmt.Sprintf("%s/%d", name, n), what: fmt.Sprintf("wait in Acquire, %d clients", n), clients: n,
		elapsed: elapsed, share: g.Counts, lat: g.Waits, ops: len(g.Waits)}
	slices.Sort(r.lat)
	task.done(fmt.Sprintf("%d acquisitions in %v", r.ops, elapsed.Round(time.Millisecond)))
	return r, nil
}
