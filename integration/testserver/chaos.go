package testserver

import (
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker/conformance/chaos"
)

// ChaosLinks is the network side of a chaos run's test bed
// (conformance/chaos): the fault proxies between each worker and the
// server(s), made in the test process (from Harness.WorkerEnv, whose result
// hands the addresses to the worker process), and the faults that act on
// the target worker's proxies. The zero value is ready to use.
type ChaosLinks struct {
	// Latency is the delay of the link-latency fault. Zero: 300ms, several
	// round trips of which fit in a renewal interval (TTL/3 of a 2s TTL)
	// while one does not fit in the drift margin.
	Latency time.Duration

	mu sync.Mutex
	m  map[int][]*Proxy
}

// Add makes worker's proxies, one to each upstream address, and returns
// their addresses in the same order.
func (c *ChaosLinks) Add(t testing.TB, worker int, upstreams ...string) []string {
	t.Helper()
	pxs := make([]*Proxy, len(upstreams))
	addrs := make([]string, len(upstreams))
	for i, up := range upstreams {
		pxs[i] = NewProxy(t, up)
		addrs[i] = pxs[i].Addr()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[int][]*Proxy{}
	}
	c.m[worker] = append(c.m[worker], pxs...)
	return addrs
}

// Proxies returns worker's proxies; it fails t when Add made none.
func (c *ChaosLinks) Proxies(t testing.TB, worker int) []*Proxy {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	pxs, ok := c.m[worker]
	if !ok {
		t.Fatalf("testserver: no chaos proxies for worker %d", worker)
	}
	return pxs
}

// Faults returns the link faults, each on every proxy of the target worker
// and healed together: link-partition (nothing passes; the connections
// survive), link-blackhole (nothing passes; healing resets every
// connection, as a NAT or firewall that dropped the flows does) and
// link-latency.
func (c *ChaosLinks) Faults() []chaos.Fault {
	latency := c.Latency
	if latency == 0 {
		latency = 300 * time.Millisecond
	}
	fault := func(name string, inject func(t *testing.T, px *Proxy)) chaos.Fault {
		return chaos.Fault{Name: name, Inject: func(t *testing.T, tg chaos.Target) func() {
			pxs := c.Proxies(t, tg.Worker)
			for _, px := range pxs {
				inject(t, px)
			}
			return func() {
				for _, px := range pxs {
					px.Heal(t)
				}
			}
		}}
	}
	return []chaos.Fault{
		fault("link-partition", func(t *testing.T, px *Proxy) { px.Partition(t) }),
		fault("link-blackhole", func(t *testing.T, px *Proxy) { px.Blackhole(t) }),
		fault("link-latency", func(t *testing.T, px *Proxy) { px.Latency(t, latency) }),
	}
}

// ServerFaults returns the faults of one server: server-pause (docker
// pause, then unpause) and server-restart (SIGKILL, then start on the same
// address; afterStart, if not nil, runs once it answers, for settings a
// restart resets). srv returns the server, which the test may make only at
// its first WorkerEnv call (worker processes run the test function too and
// must not start servers of their own).
func ServerFaults(srv func() *Server, afterStart func(t *testing.T, s *Server)) []chaos.Fault {
	return []chaos.Fault{
		{Name: "server-pause", Inject: func(t *testing.T, _ chaos.Target) func() {
			s := srv()
			s.Pause(t)
			return func() { s.Resume(t) }
		}},
		{Name: "server-restart", Inject: func(t *testing.T, _ chaos.Target) func() {
			s := srv()
			s.Kill(t)
			return func() {
				s.Start(t)
				if afterStart != nil {
					afterStart(t, s)
				}
			}
		}},
	}
}
