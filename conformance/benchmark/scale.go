package benchmark

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/benchstats"
)

// Client is one client of a side in the Scale case (a Locker, an instance
// of a competing library): it returns the Lock of any key on that client.
type Client func(key string) Lock

// ScaleSide is one implementation measured by RunScale.
type ScaleSide struct {
	Name string
	// Client opens client i of a case, like a process of its own; what it
	// opens it closes with tb.Cleanup.
	Client func(tb testing.TB, i int) Client
	// Requests, if set, is the count of requests the side's clients have
	// sent so far.
	Requests func() int64
}

// LockerClient is the Client of a Locker made by open for each client,
// taking its locks with Acquire and opts.
func LockerClient(open func(tb testing.TB) locker.Locker, opts ...locker.Option) func(tb testing.TB, i int) Client {
	return func(tb testing.TB, _ int) Client {
		l := open(tb)
		tb.Cleanup(func() { _ = l.Close() })
		return func(key string) Lock { return LockOf(l, key, opts...) }
	}
}

// Usage is what a server has done so far (totals since it started, or
// since any fixed moment: RunScale reports differences).
type Usage struct {
	CPU      time.Duration // the server process's CPU time, user and system
	Commands int64         // commands run, those a script runs included; 0 if not counted
	// Scripts is the time the server spent running scripts (Redis: INFO
	// commandstats' usec of EVAL and EVALSHA), part of CPU; 0 if unknown.
	Scripts time.Duration
}

// Scale is what RunScale needs: the sides, the shape of the load and how
// to read the server's usage.
type Scale struct {
	Sides []ScaleSide
	// Keys is how many keys the contenders share; each acquisition takes
	// one chosen at random. Default 1000.
	Keys int
	// Clients is how many clients each side opens; default 64.
	Clients int
	// PerClient is how many contenders (goroutines) use each client;
	// default 1.
	PerClient int
	// Hold is how long a holder keeps its lock; default 1ms.
	Hold time.Duration
	// Phase is how many acquisitions one side counts before the next side
	// takes its turn; default 512.
	Phase int
	// Stall fails a phase in which no contender takes a lock for that
	// long; default one minute.
	Stall time.Duration
	// Usage, if set, reads the server's totals; it is read before and
	// after every phase, so that each side is charged with the server's
	// work during its own phases only (all sides share the server).
	Usage func(ctx context.Context) (Usage, error)
}

func (s *Scale) defaults() {
	if s.Keys <= 0 {
		s.Keys = 1000
	}
	if s.Clients <= 0 {
		s.Clients = 64
	}
	if s.PerClient <= 0 {
		s.PerClient = 1
	}
	if s.Hold == 0 {
		s.Hold = time.Millisecond
	}
	if s.Phase <= 0 {
		s.Phase = 512
	}
	if s.Stall <= 0 {
		s.Stall = time.Minute
	}
}

// scaleSide is a side's group and its totals over the phases run.
type scaleSide struct {
	g        *Group
	acquired int   // every acquisition, counted or not (the drain at a phase's end)
	usage    Usage // the server's work in the side's phases
	requests int64 // the requests the side sent in its phases
}

// RunScale runs the Scale case: each side's Clients×PerClient contenders
// take and give back locks on Keys keys (a random key each time), holding
// each for Hold, b.N counted acquisitions per side, the sides taking turns
// phase by phase (which goes first rotating) so that all see the same
// machine load and server. It reports for each side: acquisitions per
// second (acq/s), the wait of an acquisition (from the call of Acquire to
// its return) at p50 and p99 (wait-p50-µs, wait-p99-µs), with one key also
// the handoff (from a release to the next acquisition) at p50 and p99,
// the fairness (share: the fewest acquisitions of a contender over the
// most), requests per acquisition (reqs/acq, if the side counts them)
// and, with Usage, the server's CPU and commands per acquisition
// (srv-cpu-µs/acq; srv-cmds/acq when the probe counts commands, and
// srv-script-µs/acq when the server tells its time in scripts; over every
// acquisition made in the side's phases, including those that end a phase
// uncounted). Then the ratios of the first side's throughput and server
// CPU to each other side's.
func RunScale(b *testing.B, s Scale) {
	s.defaults()
	if len(s.Sides) == 0 {
		b.Fatal("benchmark.RunScale: no sides")
	}
	ctx := context.Background()
	run := fmt.Sprintf("%d", time.Now().UnixNano())
	sides := make([]*scaleSide, len(s.Sides))
	for i, sd := range s.Sides {
		keys := make([]string, s.Keys)
		for k := range keys {
			keys[k] = fmt.Sprintf("bench/scale/%s/%s/%d", sd.Name, run, k)
		}
		clients := make([]Client, s.Clients)
		for c := range clients {
			clients[c] = sd.Client(b, c)
		}
		locks := make([]Lock, s.Clients*s.PerClient)
		for j := range locks {
			client := clients[j/s.PerClient]
			locks[j] = func(ctx context.Context) (func(context.Context) error, error) {
				return client(keys[rand.IntN(len(keys))])(ctx)
			}
		}
		g := NewGroup(Contended, locks)
		g.Hold, g.Stall = s.Hold, s.Stall
		g.Limit = len(locks) // many keys: many holders at once
		if s.Keys == 1 {
			g.Limit = 1
		}
		b.Cleanup(g.Stop)
		// Warm up: connections, subscriptions, scripts loaded.
		if err := g.Phase(ctx, 2*len(locks)); err != nil {
			b.Fatalf("%s: warm-up: %v", sd.Name, err)
		}
		g.reset()
		sides[i] = &scaleSide{g: g}
	}
	b.ResetTimer()
	for i, done := 0, 0; done < b.N; i, done = i+1, done+s.Phase {
		phases := make([]func(), len(sides))
		for j, sd := range sides {
			phases[j] = func() {
				if err := sd.phase(ctx, s, s.Sides[j], min(s.Phase, b.N-done)); err != nil {
					b.Fatalf("%s: %v", s.Sides[j].Name, err)
				}
			}
		}
		benchstats.Rotated(i, phases...)
	}
	b.StopTimer()
	commands := false
	for _, sd := range sides {
		commands = commands || sd.usage.Commands > 0
	}
	tput := make([]float64, len(sides))
	cpu := make([]float64, len(sides))
	for i, sd := range sides {
		g, name := sd.g, s.Sides[i].Name+"-"
		tput[i] = float64(g.Acquired) / g.Elapsed.Seconds()
		b.ReportMetric(tput[i], name+"acq/s")
		slices.Sort(g.Waits)
		b.ReportMetric(benchstats.Micros(benchstats.Percentile(g.Waits, 0.5)), name+"wait-p50-µs")
		b.ReportMetric(benchstats.Micros(benchstats.Percentile(g.Waits, 0.99)), name+"wait-p99-µs")
		if s.Keys == 1 {
			slices.Sort(g.Handoffs)
			b.ReportMetric(benchstats.Micros(benchstats.Percentile(g.Handoffs, 0.5)), name+"handoff-p50-µs")
			b.ReportMetric(benchstats.Micros(benchstats.Percentile(g.Handoffs, 0.99)), name+"handoff-p99-µs")
		}
		b.ReportMetric(g.Share(), name+"share")
		n := float64(max(sd.acquired, 1))
		if s.Sides[i].Requests != nil {
			b.ReportMetric(float64(sd.requests)/n, name+"reqs/acq")
		}
		if s.Usage != nil {
			cpu[i] = benchstats.Micros(sd.usage.CPU) / n
			b.ReportMetric(cpu[i], name+"srv-cpu-µs/acq")
			if commands { // a probe that counts them
				b.ReportMetric(float64(sd.usage.Commands)/n, name+"srv-cmds/acq")
			}
			if sd.usage.Scripts > 0 {
				b.ReportMetric(benchstats.Micros(sd.usage.Scripts)/n, name+"srv-script-µs/acq")
			}
		}
	}
	for i, sd := range s.Sides[1:] {
		b.ReportMetric(tput[0]/tput[i+1], s.Sides[0].Name+"/"+sd.Name+"-acq/s")
		if s.Usage != nil && cpu[i+1] > 0 {
			b.ReportMetric(cpu[0]/cpu[i+1], s.Sides[0].Name+"/"+sd.Name+"-srv-cpu")
		}
	}
}

// phase runs one phase of n counted acquisitions of the side and adds its
// costs to the side's totals.
func (sd *scaleSide) phase(ctx context.Context, s Scale, side ScaleSide, n int) error {
	var before Usage
	var err error
	if s.Usage != nil {
		if before, err = s.Usage(ctx); err != nil {
			return fmt.Errorf("reading the server's usage: %w", err)
		}
	}
	var reqs int64
	if side.Requests != nil {
		reqs = side.Requests()
	}
	gen := sd.g.acquisitions()
	if err := sd.g.Phase(ctx, n); err != nil {
		return err
	}
	sd.acquired += sd.g.acquisitions() - gen
	if side.Requests != nil {
		sd.requests += side.Requests() - reqs
	}
	if s.Usage != nil {
		after, err := s.Usage(ctx)
		if err != nil {
			return fmt.Errorf("reading the server's usage: %w", err)
		}
		sd.usage.CPU += after.CPU - before.CPU
		sd.usage.Commands += after.Commands - before.Commands
		sd.usage.Scripts += after.Scripts - before.Scripts
	}
	return nil
}

// acquisitions is how many acquisitions the group has made, counted or
// not.
func (g *Group) acquisitions() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.gen
}
