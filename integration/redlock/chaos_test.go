package redlock_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// Chaos worker processes learn from these variables the addresses of their
// own proxies to the nodes (comma-separated, in node order) and the file
// where they log their acquisitions for the checks of the majority fault.
const (
	envChaosAddrs = "LOCKER_CHAOS_REDLOCK_ADDRS"
	envChaosLog   = "LOCKER_CHAOS_REDLOCK_LOG"
)

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
		acqs, _ := c.readLogs(t)
		during, long, starved := 0, 0, 0
		for _, w := range c.windows {
			if !strings.HasPrefix(w.name, "minority-node-") {
				continue
			}
			n := 0
			for _, a := range acqs {
				if a.Done >= w.start+int64(300*time.Millisecond) && a.Done <= w.end {
					n++
				}
			}
			during += n
			if w.end-w.start >= int64(5*chaosTTL/2) {
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
			c.dumpLogs(t)
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
		c.checkMajority(t, r)
	})
}

// chaosBed is one run's nodes, proxies and fault windows (in the test
// process; in a worker process only its harness's NewLocker is used).
type chaosBed struct {
	nodes  []*testserver.Server // nil in a worker process
	logDir string
	next   int // the node (or first of two) the next node fault hits

	mu      sync.Mutex
	proxies map[int][]*testserver.Proxy // by worker, in node order
	windows []faultWindow
}

// faultWindow is when a fault of the harness was fully in place: from the
// end of its injection to the start of its heal (Unix nanoseconds).
type faultWindow struct {
	name       string
	start, end int64
}

func newChaosBed(t *testing.T) *chaosBed {
	c := &chaosBed{proxies: map[int][]*testserver.Proxy{}}
	if os.Getenv(envChaosAddrs) != "" {
		return c // a worker process
	}
	c.nodes = testserver.NewRedisDurableNodes(t, chaosNodes)
	for _, n := range c.nodes {
		if !n.CanControl() {
			t.Skipf("the nodes come from %s: the chaos test needs nodes it can pause and kill", testserver.EnvRedisNodes)
		}
	}
	c.logDir = t.TempDir()
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
			return []string{
				envChaosAddrs + "=" + strings.Join(addrs, ","),
				envChaosLog + "=" + filepath.Join(c.logDir, fmt.Sprintf("worker-%d.jsonl", worker)),
			}
		},
		NewLocker: newChaosLocker,
	}
}

// newChaosLocker runs in a worker process: a Redlock on the worker's
// proxies, whose acquisitions, losses and releases it logs.
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
	f, err := os.OpenFile(w.Env(envChaosLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatalf("chaos worker: %v", err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return &loggingLocker{Locker: l, log: &chaosLog{w: w.Index, f: f}}
}

// nodeFault hits one node, a different one each time.
func (c *chaosBed) nodeFault(name string, inject func(t *testing.T, s *testserver.Server) func()) chaos.Fault {
	return chaos.Fault{Name: name, Inject: func(t *testing.T, _ chaos.Target) func() {
		s := c.nodes[c.next%chaosNodes]
		c.next++
		heal := inject(t, s)
		return c.window(name, heal)
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
		return c.window(name, func() {
			b.Resume(t)
			a.Resume(t)
		})
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
		return c.window(name, func() {
			for _, px := range pxs {
				px.Heal(t)
			}
		})
	}}
}

// window records that the fault name is in place from now until heal is
// called.
func (c *chaosBed) window(name string, heal func()) func() {
	start := time.Now().UnixNano()
	return func() {
		end := time.Now().UnixNano()
		c.mu.Lock()
		c.windows = append(c.windows, faultWindow{name, start, end})
		c.mu.Unlock()
		heal()
	}
}

// checkMajority checks the acquisitions the workers logged against the
// majority pauses: none completed within one, and every lock held when one
// began was reported lost within a TTL of it, unless released before.
func (c *chaosBed) checkMajority(t *testing.T, r *chaos.Report) {
	acqs, losses := c.readLogs(t)
	type hk struct {
		w   int
		key string
		tok int64
	}
	lost := map[hk]int64{}
	for _, l := range losses {
		lost[hk{l.W, l.Key, l.Tok}] = l.At
	}
	attempted, held, lateOK := 0, 0, 0
	minMargin := time.Duration(1<<63 - 1) // the least time between a loss reported and its due time
	for _, w := range c.windows {
		for _, a := range acqs {
			if a.Inv >= w.start && a.Done <= w.end {
				t.Errorf("worker %d acquired %q (token %d) in %v while two of the three nodes were paused (%v to %v): no majority could grant it",
					a.W, a.Key, a.Tok, time.Duration(a.Done-a.Inv), stamp(w.start), stamp(w.end))
			}
			if a.Inv < w.start || a.Inv > w.end {
				continue
			}
			attempted++
		}
		due := w.start + int64(chaosTTL)
		if w.end < due+int64(chaosSlack) {
			continue // too short for the lease to run out during it
		}
		for _, a := range acqs {
			// Acquired before the pause (its round sent before it), still in
			// use a TTL later.
			if a.Inv >= w.start || a.Done > w.end || (a.RelInv != 0 && a.RelInv <= due) {
				continue
			}
			held++
			at, ok := lost[hk{a.W, a.Key, a.Tok}]
			switch {
			case !ok:
				t.Errorf("worker %d's lock of %q (token %d, acquired at %s) was never reported lost though two of three nodes were paused from %s to %s, longer than its TTL",
					a.W, a.Key, a.Tok, stamp(a.Done), stamp(w.start), stamp(w.end))
			case at > due+int64(chaosSlack):
				t.Errorf("worker %d's lock of %q (token %d) was reported lost at %s, %v after the majority froze (%s): later than its TTL, when a node may have expired it",
					a.W, a.Key, a.Tok, stamp(at), time.Duration(at-w.start), stamp(w.start))
			default:
				lateOK++
				minMargin = min(minMargin, time.Duration(due-at))
			}
		}
	}
	margin := "-"
	if lateOK > 0 {
		margin = minMargin.Round(time.Millisecond).String()
	}
	t.Logf("majority pauses: %d; acquisitions begun during one that succeeded: %d (%d of them completed within it: must be 0); locks held a TTL into one: %d, reported lost in time: %d (the latest %v before a TTL after the freeze)",
		r.Faults["majority-pause"], attempted, countWithin(acqs, c.windows), held, lateOK, margin)
	if r.Faults["majority-pause"] == 0 || r.Acquired == 0 {
		t.Errorf("the run exercised too little: %v", r)
	}
}

func countWithin(acqs []chaosAcq, ws []faultWindow) int {
	n := 0
	for _, w := range ws {
		for _, a := range acqs {
			if a.Inv >= w.start && a.Done <= w.end {
				n++
			}
		}
	}
	return n
}

func stamp(ns int64) string { return time.Unix(0, ns).UTC().Format("15:04:05.000") }

// chaosAcq is a successful acquisition a worker logged, with when its
// Release was called (0: never).
type chaosAcq struct {
	W         int
	Key       string
	Tok       int64
	Inv, Done int64
	RelInv    int64
}

// chaosLoss is a loss a worker's Handle reported.
type chaosLoss struct {
	W   int
	Key string
	Tok int64
	At  int64
}

// readLogs reads what the workers logged.
func (c *chaosBed) readLogs(t *testing.T) ([]chaosAcq, []chaosLoss) {
	var acqs []chaosAcq
	var losses []chaosLoss
	files, err := filepath.Glob(filepath.Join(c.logDir, "worker-*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		open := map[string]int{} // key/token -> index in acqs
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var e chaosEntry
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				t.Fatalf("%s: %q: %v", name, sc.Text(), err)
			}
			id := fmt.Sprintf("%s/%d", e.Key, e.Tok)
			switch e.Op {
			case "acquire":
				open[id] = len(acqs)
				acqs = append(acqs, chaosAcq{W: e.W, Key: e.Key, Tok: e.Tok, Inv: e.Inv, Done: e.Done})
			case "release":
				if i, ok := open[id]; ok {
					acqs[i].RelInv = e.Inv
				}
			case "lost":
				losses = append(losses, chaosLoss{W: e.W, Key: e.Key, Tok: e.Tok, At: e.Inv})
			}
		}
		_ = f.Close()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return acqs, losses
}

// chaosEntry is one line of a worker's log.
type chaosEntry struct {
	W    int    `json:"w"`
	Op   string `json:"op"` // acquire (successful), release (called), lost (Done closed with ErrLost)
	Key  string `json:"key"`
	Tok  int64  `json:"tok"`
	Inv  int64  `json:"inv"`
	Done int64  `json:"done,omitempty"`
	Err  string `json:"err,omitempty"`
}

// chaosLog appends entries to a worker's log, one write per line.
type chaosLog struct {
	w  int
	mu sync.Mutex
	f  *os.File
}

func (l *chaosLog) add(e chaosEntry) {
	e.W = l.w
	b, _ := json.Marshal(e)
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.f.Write(append(b, '\n'))
}

// loggingLocker logs its successful acquisitions, and its Handles their
// losses and Release calls.
type loggingLocker struct {
	locker.Locker
	log *chaosLog
}

func (l *loggingLocker) Acquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return l.logged(time.Now().UnixNano(), key)(l.Locker.Acquire(ctx, key, opts...))
}

func (l *loggingLocker) TryAcquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return l.logged(time.Now().UnixNano(), key)(l.Locker.TryAcquire(ctx, key, opts...))
}

func (l *loggingLocker) logged(inv int64, key string) func(locker.Handle, error) (locker.Handle, error) {
	return func(h locker.Handle, err error) (locker.Handle, error) {
		if err != nil {
			l.log.add(chaosEntry{Op: "acquire-failed", Key: key, Inv: inv, Done: time.Now().UnixNano(), Err: err.Error()})
			return nil, err
		}
		l.log.add(chaosEntry{Op: "acquire", Key: key, Tok: h.Token(), Inv: inv, Done: time.Now().UnixNano()})
		go func() {
			<-h.Done()
			at := time.Now().UnixNano()
			if errors.Is(h.Err(), locker.ErrLost) {
				l.log.add(chaosEntry{Op: "lost", Key: key, Tok: h.Token(), Inv: at})
			}
		}()
		return &loggingHandle{Handle: h, log: l.log}, nil
	}
}

type loggingHandle struct {
	locker.Handle
	log *chaosLog
}

func (h *loggingHandle) Release(ctx context.Context) error {
	h.log.add(chaosEntry{Op: "release", Key: h.Key(), Tok: h.Token(), Inv: time.Now().UnixNano()})
	return h.Handle.Release(ctx)
}

// dumpLogs logs every worker's entries and the fault windows in time order.
func (c *chaosBed) dumpLogs(t *testing.T) {
	type line struct {
		at int64
		s  string
	}
	var ls []line
	files, _ := filepath.Glob(filepath.Join(c.logDir, "worker-*.jsonl"))
	for _, name := range files {
		b, _ := os.ReadFile(name)
		for _, raw := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var e chaosEntry
			if json.Unmarshal([]byte(raw), &e) == nil {
				ls = append(ls, line{e.Inv, fmt.Sprintf("w%d %s %s tok=%d took=%v %s", e.W, e.Op, e.Key, e.Tok, time.Duration(max(e.Done-e.Inv, 0)).Round(time.Millisecond), e.Err)})
			}
		}
	}
	for _, w := range c.windows {
		ls = append(ls, line{w.start, "FAULT " + w.name + " begins"}, line{w.end, "FAULT " + w.name + " ends"})
	}
	sort.Slice(ls, func(i, j int) bool { return ls[i].at < ls[j].at })
	for _, l := range ls {
		t.Logf("%s %s", stamp(l.at), l.s)
	}
}
