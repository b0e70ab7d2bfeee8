package etcd_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/chaos"
	"github.com/go-locker/locker/etcd"
	"github.com/go-locker/locker/integration/testserver"
)

// envChaosAddrs hands a chaos worker process the addresses of its own fault
// proxies to the server (comma-separated: one per member it dials).
const envChaosAddrs = "LOCKER_CHAOS_ETCD_ADDRS"

// chaosLocker is a worker's Locker: an etcd client of its own on the
// proxies the test process made for it.
func chaosLocker(t *testing.T, w chaos.Worker) locker.Locker {
	addrs := strings.Split(w.Env(envChaosAddrs), ",")
	if len(addrs) == 0 || addrs[0] == "" {
		t.Fatalf("%s is not set", envChaosAddrs)
	}
	return etcd.New(newEtcdClient(t, addrs...))
}

// linkFaults cut (partition, blackhole) or slow every link of the target
// worker to the server, through the proxies of that worker.
func linkFaults(proxies func(t *testing.T, worker int) []*testserver.Proxy) []chaos.Fault {
	fault := func(name string, inject func(t *testing.T, px *testserver.Proxy)) chaos.Fault {
		return chaos.Fault{Name: name, Inject: func(t *testing.T, tg chaos.Target) func() {
			pxs := proxies(t, tg.Worker)
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
		fault("link-partition", func(t *testing.T, px *testserver.Proxy) { px.Partition(t) }),
		fault("link-blackhole", func(t *testing.T, px *testserver.Proxy) { px.Blackhole(t) }),
		fault("link-latency", func(t *testing.T, px *testserver.Proxy) { px.Latency(t, 300*time.Millisecond) }),
	}
}

// workerProxies records the proxies made for each worker, in the test
// process.
type workerProxies struct {
	mu sync.Mutex
	m  map[int][]*testserver.Proxy
}

func (w *workerProxies) add(worker int, pxs []*testserver.Proxy) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[int][]*testserver.Proxy{}
	}
	w.m[worker] = pxs
	addrs := make([]string, len(pxs))
	for i, px := range pxs {
		addrs[i] = px.Addr()
	}
	return envChaosAddrs + "=" + strings.Join(addrs, ",")
}

func (w *workerProxies) get(t *testing.T, worker int) []*testserver.Proxy {
	w.mu.Lock()
	defer w.mu.Unlock()
	pxs, ok := w.m[worker]
	if !ok {
		t.Fatalf("no proxies for worker %d", worker)
	}
	return pxs
}

// TestChaos runs the chaos suite on a private single-member etcd: worker
// processes, each on its own client through a fault proxy of its own,
// while the nemesis stops holder processes past their lease (built in),
// pauses the server, kills it and starts it again (its data directory
// kept: leases and keys survive, and the server restarts every lease's
// clock), and cuts, blackholes or slows the link of one worker.
func TestChaos(t *testing.T) {
	var (
		srv *testserver.Server
		pxs workerProxies
	)
	faults := []chaos.Fault{
		{Name: "server-pause", Inject: func(t *testing.T, _ chaos.Target) func() {
			srv.Pause(t)
			return func() { srv.Resume(t) }
		}},
		{Name: "server-restart", Inject: func(t *testing.T, _ chaos.Target) func() {
			srv.Kill(t)
			return func() { srv.Start(t) }
		}},
	}
	r := chaos.Run(t, chaos.Harness{
		TTL: ttl,
		// WorkerEnv runs in the test process only: the server is started
		// there, once, and each worker gets a proxy to it.
		WorkerEnv: func(t *testing.T, w int) []string {
			if srv == nil {
				srv = testserver.NewEtcd(t)
				if !srv.CanControl() {
					t.Skip("the server comes from the environment: the chaos test needs one it can pause and kill")
				}
			}
			return []string{pxs.add(w, []*testserver.Proxy{testserver.NewProxy(t, srv.Addr())})}
		},
		NewLocker: chaosLocker,
		Faults:    append(faults, linkFaults(pxs.get)...),
	})
	if r == nil {
		return // a worker process
	}
	if r.Acquired == 0 || len(r.Faults) == 0 {
		t.Errorf("the run exercised too little: %v", r)
	}
}

// TestChaosCluster runs the chaos suite on the shared 3-member cluster.
// Workers 0 and 1 dial every member, workers 2 and 3 one member each (the
// first and the second), each link through a proxy of the worker's own,
// so that a member fault cuts some holders off and merely reroutes
// others. The nemesis pauses the leader (an election follows; the new
// leader keeps the leases, a holder cut off with the old one must report
// its loss first) or a follower, and cuts or slows every link of one
// worker, besides the built-in holder pause. Every member runs again, and
// the cluster has one leader every member follows, when the test returns.
func TestChaosCluster(t *testing.T) {
	var (
		ms     []*testserver.Server
		pxs    workerProxies
		mu     sync.Mutex
		paused *testserver.Server
	)
	pause := func(t *testing.T, m *testserver.Server) func() {
		mu.Lock()
		paused = m
		mu.Unlock()
		m.Pause(t)
		return func() {
			m.Resume(t)
			mu.Lock()
			paused = nil
			mu.Unlock()
			testserver.WaitEtcdLeader(t, ms)
		}
	}
	faults := []chaos.Fault{
		{Name: "leader-pause", Inject: func(t *testing.T, _ chaos.Target) func() {
			return pause(t, testserver.EtcdLeader(t, ms))
		}},
		{Name: "follower-pause", Inject: func(t *testing.T, tg chaos.Target) func() {
			fs := others(ms, testserver.EtcdLeader(t, ms))
			return pause(t, fs[tg.Worker%len(fs)])
		}},
	}
	r := chaos.Run(t, chaos.Harness{
		TTL: ttl,
		WorkerEnv: func(t *testing.T, w int) []string {
			if ms == nil {
				ms = testserver.EtcdCluster(t)
				for _, m := range ms {
					if !m.CanControl() {
						t.Skip("the cluster comes from the environment: the chaos test needs members it can pause")
					}
				}
				testserver.WaitEtcdLeader(t, ms)
				// Leave the shared cluster as it was found, also when the
				// test stops in the middle of a fault.
				t.Cleanup(func() {
					mu.Lock()
					m := paused
					mu.Unlock()
					if m != nil {
						m.Resume(t)
					}
					testserver.WaitEtcdLeader(t, ms)
				})
			}
			dial := ms
			if w >= 2 {
				dial = ms[(w-2)%len(ms) : (w-2)%len(ms)+1]
			}
			var wp []*testserver.Proxy
			for _, m := range dial {
				wp = append(wp, testserver.NewProxy(t, m.Addr()))
			}
			return []string{pxs.add(w, wp)}
		},
		NewLocker: chaosLocker,
		Faults:    append(faults, linkFaults(pxs.get)...),
	})
	if r == nil {
		return // a worker process
	}
	if r.Acquired == 0 || len(r.Faults) == 0 {
		t.Errorf("the run exercised too little: %v", r)
	}
}
