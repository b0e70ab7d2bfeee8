package zookeeper_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/chaos"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/zookeeper"
)

// envChaosAddr hands a chaos worker process the address of its own fault
// proxy to the server.
const envChaosAddr = "LOCKER_CHAOS_ZOOKEEPER_ADDR"

// chaosTTL is both the session timeout of the workers' Lockers and the TTL
// they ask for: a ZooKeeper lock's lease is its session (the test server,
// tickTime 500ms, grants 1s to 10s as asked).
const chaosTTL = 2 * time.Second

// TestChaos runs the chaos suite on a private ZooKeeper server: worker
// processes, each on its own session through a fault proxy of its own,
// while the nemesis stops holder processes past their session (built in),
// pauses the server, kills it and starts it again with its data directory
// kept (sessions and their nodes survive a restart the client outlasts;
// with a 2s session they usually do not, and the holders report the loss),
// and cuts, blackholes or slows the link of one worker.
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
	duration := time.Duration(0) // the suite's default
	if f != (chaos.Family{}) {
		duration = 20 * time.Second
	}
	r := chaos.Run(t, chaos.Harness{
		Family:   f,
		Duration: duration,
		TTL:      chaosTTL,
		// WorkerEnv runs in the test process only: the server is started
		// there, once, and each worker gets a proxy to it.
		WorkerEnv: func(t *testing.T, w int) []string {
			if srv == nil {
				srv = testserver.NewZooKeeper(t)
				if !srv.CanControl() {
					t.Skip("the server comes from the environment: the chaos test needs one it can pause and kill")
				}
			}
			return []string{envChaosAddr + "=" + links.Add(t, w, srv.Addr())[0]}
		},
		NewLocker: func(t *testing.T, w chaos.Worker) locker.Locker {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			l, err := zookeeper.Connect(ctx, []string{w.Env(envChaosAddr)},
				zookeeper.WithDefaultTTL(chaosTTL))
			if err != nil {
				t.Fatalf("zookeeper.Connect: %v", err)
			}
			return l
		},
		Faults: append(testserver.ServerFaults(func() *testserver.Server { return srv }, nil), links.Faults()...),
	})
	if r == nil {
		return // a worker process
	}
	if r.Acquired == 0 || len(r.Faults) == 0 {
		t.Errorf("the run exercised too little: %v", r)
	}
}
