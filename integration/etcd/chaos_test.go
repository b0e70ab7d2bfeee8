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

// TestChaos runs the chaos suite on a private single-member etcd: worker
// processes, each on its own client through a fault proxy of its own,
// while the nemesis stops holder processes past their lease (built in),
// pauses the server, kills it and starts it again (its data directory
// kept: leases and keys survive, and the server restarts every lease's
// clock), and cuts, blackholes or slows the link of one worker.
func TestChaos(t *testing.T) { runChaos(t, chaos.Family{}) }

// TestChaosSemaphore and TestChaosReadWrite are TestChaos for the lock
// families, with the same faults, for 20s (room for at least one fault before the
// last 4 TTL, which are fault-free).
func TestChaosSemaphore(t *testing.T) { runChaos(t, chaos.Semaphore(2)) }
func TestChaosReadWrite(t *testing.T) { runChaos(t, chaos.ReadWrite()) }

func runChaos(t *testing.T, f chaos.Family) {
	var (
		srv   *testserver.Server
		links testserver.ChaosLinks
	)
	faults := testserver.ServerFaults(func() *testserver.Server { return srv }, nil)
	duration := time.Duration(0) // the suite's default
	if f != (chaos.Family{}) {
		duration = 20 * time.Second
	}
	r := chaos.Run(t, chaos.Harness{
		Family:   f,
		Duration: duration,
		TTL:      ttl,
		// WorkerEnv runs in the test process only: the server is started
		// there, once, and each worker gets a proxy to it.
		WorkerEnv: func(t *testing.T, w int) []string {
			if srv == nil {
				srv = testserver.NewEtcd(t)
				if !srv.CanControl() {
					t.Skip("the server comes from the environment: the chaos test needs one it can pause and kill")
				}
			}
			return []string{envChaosAddrs + "=" + links.Add(t, w, srv.Addr())[0]}
		},
		NewLocker: chaosLocker,
		Faults:    append(faults, links.Faults()...),
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
		links  testserver.ChaosLinks
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
			var ups []string
			for _, m := range dial {
				ups = append(ups, m.Addr())
			}
			return []string{envChaosAddrs + "=" + strings.Join(links.Add(t, w, ups...), ",")}
		},
		NewLocker: chaosLocker,
		Faults:    append(faults, links.Faults()...),
	})
	if r == nil {
		return // a worker process
	}
	if r.Acquired == 0 || len(r.Faults) == 0 {
		t.Errorf("the run exercised too little: %v", r)
	}
}
