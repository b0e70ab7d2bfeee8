package redlock_test

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/chaos"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis/redlock"
)

// envChaosAddrs hands a chaos worker process the addresses of its own
// proxies to the nodes (comma-separated, in node order).
const envChaosAddrs = "LOCKER_CHAOS_REDLOCK_ADDRS"

const (
	chaosNodes = 3
	chaosTTL   = 2 * time.Second
	// chaosLatency slows every link of a worker past the node timeout
	// (TTL/10 = 200ms): each grant's reply comes too late to count.
	chaosLatency = 300 * time.Millisecond
	// chaosSlack is how late, by the machine's clock, a loss may be
	// observed after the moment it is due (the chaos suite's own
	// allowance between two processes' observations).
	chaosSlack = 100 * time.Millisecond
)

// TestChaos runs Redlock on 3 private nodes under the chaos suite. The
// nodes run with appendonly yes and appendfsync always, as the package doc
// requires for fencing across restarts. Each worker process reaches each
// node through a fault proxy of its own.
//
// Minority: faults on one node at a time (paused, killed and restarted,
// one worker's link to it cut), besides the built-in holder pause and
// faults on all of one worker's links (partitioned, slowed past the node
// timeout). Locking must go on throughout.
//
// Majority: two nodes paused at once. Beyond the suite's checks (no second
// holder unless the first had reported the loss, ordered tokens), no
// acquisition may complete while the majority is paused, and every lock
// held when they froze and not released within a TTL must be reported lost
// no later than a TTL after they froze: by then a node could have expired
// it.
func TestChaos(t *testing.T) {
	t.Run("Minority", func(t *testing.T) {
		c := newChaosBed(t)
		h := c.harness()
		if c.nodes != nil {
			h.Faults = append(h.Faults,
				c.nodeFault("minority-node-pause", func(t *testing.T, s *testserver.Server) func() {
					s.Pause(t)
					return func() { s.Resume(t) }
				}),
				c.nodeFault("minority-node-restart", func(t *testing.T, s *testserver.Server) func() {
					s.Kill(t)
					return func() { s.Start(t) }
				}),
				c.linkFault("minority-link-partition", false, func(t *testing.T, px *testserver.Proxy) { px.Partition(t) }),
				c.linkFault("link-partition", true, func(t *testing.T, px *testserver.Proxy) { px.Partition(t) }),
				c.linkFault("link-latency", true, func(t *testing.T, px *testserver.Proxy) { px.Latency(t, chaosLatency) }),
			)
		}
		r := chaos.Run(t, h)
		if r == nil {
			return // a worker process
		}
		// Locking goes on with one node down: a fault on one node that
		// lasts longer than the longest hold (2 TTL) plus a hand-off sees
		// an acquisition complete (a round sent after the node went down:
		// rounds end within the node timeout, 200ms).
		during, long, starved := 0, 0, 0
		for _, w := range r.Injected {
			if !strings.HasPrefix(w.Name, "minority-node-") {
				continue
			}
			n := 0
			for _, a := range r.Holds {
				if !a.Acquired.Before(w.Start.Add(300*time.Millisecond)) && !a.Acquired.After(w.End) {
					n++
				}
			}
			during += n
			if w.End.Sub(w.Start) >= 5*chaosTTL/2 {
				long++
				if n == 0 {
					starved++
				}
			}
		}
		t.Logf("acquisitions completed while one node was paused or down: %d (faults longer than %v: %d, of which without any acquisition: %d)", during, 5*chaosTTL/2, long, starved)
		if r.Acquired == 0 || len(r.Faults) == 0 {
			t.Errorf("the run exercised too little: %v", r)
		}
		if starved > 0 {
			dumpHistory(t, r)
			t.Errorf("%d faults on one node lasted %v or more without any acquisition: Redlock must keep locking on the majority", starved, 5*chaosTTL/2)
		}
	})
	t.Run("Majority", func(t *testing.T) {
		c := newChaosBed(t)
		h := c.harness()
		h.NoHolderPause = true // every fault is a majority fault
		// More holders at once: more locks held across each pause.
		h.Workers, h.Keys = 6, 3
		if c.nodes != nil {
			h.Faults = append(h.Faults, c.majorityPause())
		}
		r := chaos.Run(t, h)
		if r == nil {
			return // a worker process
		}
		checkMajority(t, r)
	})
}

// TestChaosSemaphore and TestChaosReadWrite run the lock families under
// the Minority faults (one node paused, or killed and restarted; one
// worker's link to one node cut), besides the built-in holder pause, for
// 20s each.
func TestChaosSemaphore(t *testing.T) { chaosFamily(t, chaos.Semaphore(2)) }
func TestChaosReadWrite(t *testing.T) { chaosFamily(t, chaos.ReadWrite()) }

func chaosFamily(t *testing.T, f chaos.Family) {
	c := newChaosBed(t)
	h := c.harness()
	h.Family, h.Duration = f, 20*time.Second
	if c.nodes != nil {
		h.Faults = append(h.Faults,
			c.nodeFault("minority-node-pause", func(t *testing.T, s *testserver.Server) func() {
				s.Pause(t)
				return func() { s.Resume(t) }
			}),
			c.nodeFault("minority-node-restart", func(t *testing.T, s *testserver.Server) func() {
				s.Kill(t)
				return func() { s.Start(t) }
			}),
			c.linkFault("minority-link-partition", false, func(t *testing.T, px *testserver.Proxy) { px.Partition(t) }),
		)
	}
	r := chaos.Run(t, h)
	if r == nil {
		return // a worker process
	}
	if r.Acquired == 0 || len(r.Faults) == 0 {
		t.Errorf("the run exercised too little: %v", r)
	}
}

// chaosBed is one run's nodes and proxies (in the test process; in a
// worker process only its harness's NewLocker is used).
type chaosBed struct {
	nodes []*testserver.Server // nil in a worker process
	next  int                  // the node (or first of two) the next node fault hits

	mu      sync.Mutex
	proxies map[int][]*testserver.Proxy // by worker, in node order
}

func newChaosBed(t *testing.T) *chaosBed {
	c := &chaosBed{proxies: map[int][]*testserver.Proxy{}}
	if os.Getenv(envChaosAddrs) != "" {
		return c // a worker process
	}
	if nodesPublished {
		// Set by this process for the conformance suite's children (with
		// -count, an earlier run of it): not nodes from the environment.
		t.Setenv(testserver.EnvRedisNodes, "")
	}
	c.nodes = testserver.NewRedisDurableNodes(t, chaosNodes)
	for _, n := range c.nodes {
		if !n.CanControl() {
			t.Skipf("the nodes come from %s: the chaos test needs nodes it can pause and kill", testserver.EnvRedisNodes)
		}
	}
	return c
}

func (c *chaosBed) harness() chaos.Harness {
	return chaos.Harness{
		TTL: chaosTTL,
		WorkerEnv: func(t *testing.T, worker int) []string {
			var pxs []*testserver.Proxy
			var addrs []string
			for _, n := range c.nodes {
				px := testserver.NewProxy(t, n.Addr())
				pxs = append(pxs, px)
				addrs = append(addrs, px.Addr())
			}
			c.mu.Lock()
			c.proxies[worker] = pxs
			c.mu.Unlock()
			return []string{envChaosAddrs + "=" + strings.Join(addrs, ",")}
		},
		NewLocker: newChaosLocker,
	}
}

// newChaosLocker runs in a worker process: a Redlock on the worker's
// proxies.
func newChaosLocker(t *testing.T, w chaos.Worker) locker.Locker {
	addrs := strings.Split(w.Env(envChaosAddrs), ",")
	if len(addrs) != chaosNodes {
		t.Fatalf("chaos worker: %s=%q: want %d addresses", envChaosAddrs, w.Env(envChaosAddrs), chaosNodes)
	}
	var cs []goredis.UniversalClient
	for _, a := range addrs {
		c := goredis.NewClient(&goredis.Options{
			Addr:                  a,
			ContextTimeoutEnabled: true,
			DialTimeout:           time.Second,
			ReadTimeout:           time.Second,
			WriteTimeout:          time.Second,
		})
		t.Cleanup(func() { _ = c.Close() }) // after the Locker's Close (chaos closes it first)
		cs = append(cs, c)
	}
	l := redlock.New(cs)
	if err := l.Err(); err != nil {
		t.Fatalf("redlock.New: %v", err)
	}
	return l
}

// nodeFault hits one node, a different one each time.
func (c *chaosBed) nodeFault(name string, inject func(t *testing.T, s *testserver.Server) func()) chaos.Fault {
	return chaos.Fault{Name: name, Inject: func(t *testing.T, _ chaos.Target) func() {
		s := c.nodes[c.next%chaosNodes]
		c.next++
		return inject(t, s)
	}}
}

// majorityPause pauses two nodes at once, a different pair each time.
func (c *chaosBed) majorityPause() chaos.Fault {
	const name = "majority-pause"
	return chaos.Fault{Name: name, Inject: func(t *testing.T, _ chaos.Target) func() {
		a, b := c.nodes[c.next%chaosNodes], c.nodes[(c.next+1)%chaosNodes]
		c.next++
		a.Pause(t)
		b.Pause(t)
		return func() {
			b.Resume(t)
			a.Resume(t)
		}
	}}
}

// linkFault acts on the target worker's link to one node (a different one
// each time), or to every node.
func (c *chaosBed) linkFault(name string, all bool, cut func(t *testing.T, px *testserver.Proxy)) chaos.Fault {
	return chaos.Fault{Name: name, Inject: func(t *testing.T, tg chaos.Target) func() {
		c.mu.Lock()
		pxs := c.proxies[tg.Worker]
		c.mu.Unlock()
		if !all {
			pxs = pxs[c.next%chaosNodes : c.next%chaosNodes+1]
			c.next++
		}
		for _, px := range pxs {
			cut(t, px)
		}
		return func() {
			for _, px := range pxs {
				px.Heal(t)
			}
		}
	}}
}

// checkMajority checks the run's holds against the majority pauses: none
// completed within one, and every lock held when one began was reported
// lost within a TTL of it, unless released before.
func checkMajority(t *testing.T, r *chaos.Report) {
	attempted, held, lateOK, within := 0, 0, 0, 0
	minMargin := time.Duration(1<<63 - 1) // the least time between a loss reported and its due time
	for _, w := range r.Injected {
		if w.Name != "majority-pause" {
			continue
		}
		for _, a := range r.Holds {
			if !a.Invoked.Before(w.Start) && !a.Acquired.After(w.End) {
				within++
				t.Errorf("worker %d acquired %q (token %d) in %v while two of the three nodes were paused (%v to %v): no majority could grant it",
					a.Worker, a.Key, a.Token, a.Acquired.Sub(a.Invoked), stamp(w.Start), stamp(w.End))
			}
			if !a.Invoked.Before(w.Start) && !a.Invoked.After(w.End) {
				attempted++
			}
		}
		due := w.Start.Add(chaosTTL)
		if w.End.Before(due.Add(chaosSlack)) {
			continue // too short for the lease to run out during it
		}
		for _, a := range r.Holds {
			// Acquired before the pause (its round sent before it), still in
			// use a TTL later.
			if !a.Invoked.Before(w.Start) || a.Acquired.After(w.End) || (!a.Released.IsZero() && !a.Released.After(due)) {
				continue
			}
			held++
			switch {
			case a.Lost.IsZero():
				t.Errorf("worker %d's lock of %q (token %d, acquired at %s) was never reported lost though two of three nodes were paused from %s to %s, longer than its TTL",
					a.Worker, a.Key, a.Token, stamp(a.Acquired), stamp(w.Start), stamp(w.End))
			case a.Lost.After(due.Add(chaosSlack)):
				t.Errorf("worker %d's lock of %q (token %d) was reported lost at %s, %v after the majority froze (%s): later than its TTL, when a node may have expired it",
					a.Worker, a.Key, a.Token, stamp(a.Lost), a.Lost.Sub(w.Start), stamp(w.Start))
			default:
				lateOK++
				minMargin = min(minMargin, due.Sub(a.Lost))
			}
		}
	}
	margin := "-"
	if lateOK > 0 {
		margin = minMargin.Round(time.Millisecond).String()
	}
	t.Logf("majority pauses: %d; acquisitions begun during one: %d (completed within it: %d, must be 0); locks held a TTL into one: %d, reported lost in time: %d (the latest %v before a TTL after the freeze)",
		r.Faults["majority-pause"], attempted, within, held, lateOK, margin)
	if r.Faults["majority-pause"] == 0 || r.Acquired == 0 {
		t.Errorf("the run exercised too little: %v", r)
	}
	if t.Failed() {
		dumpHistory(t, r)
	}
}

func stamp(at time.Time) string { return at.UTC().Format("15:04:05.000") }

// dumpHistory logs the run's holds and faults in time order.
func dumpHistory(t *testing.T, r *chaos.Report) {
	type line struct {
		at time.Time
		s  string
	}
	var ls []line
	for _, a := range r.Holds {
		ls = append(ls, line{a.Acquired, fmt.Sprintf("w%d acquired %s token %d (asked %v before)", a.Worker, a.Key, a.Token, a.Acquired.Sub(a.Invoked).Round(time.Millisecond))})
		if !a.Lost.IsZero() {
			ls = append(ls, line{a.Lost, fmt.Sprintf("w%d lost %s token %d", a.Worker, a.Key, a.Token)})
		}
		if !a.Released.IsZero() {
			ls = append(ls, line{a.Released, fmt.Sprintf("w%d releases %s token %d: %s", a.Worker, a.Key, a.Token, a.ReleaseErr)})
		}
	}
	for _, w := range r.Injected {
		ls = append(ls, line{w.Start, "FAULT " + w.Name + " begins"}, line{w.End, "FAULT " + w.Name + " ends"})
	}
	sort.Slice(ls, func(i, j int) bool { return ls[i].at.Before(ls[j].at) })
	for _, l := range ls {
		t.Logf("%s %s", stamp(l.at), l.s)
	}
}
