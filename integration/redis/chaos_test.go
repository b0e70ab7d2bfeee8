package redis_test

import (
	"os"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/chaos"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis"
)

// envChaosAddr hands a chaos worker process the address of its own fault
// proxy to the test's server.
const envChaosAddr = "LOCKER_CHAOS_REDIS_ADDR"

// TestChaos runs the single-node backend under the chaos suite: worker
// processes, each reaching a private Redis through a fault proxy of its
// own, while a nemesis stops holders past their lease (built in), pauses
// the server, kills and restarts it, and cuts (partition, blackhole) or
// slows one worker's link. The server runs with appendonly yes and
// appendfsync always, as the package's doc recommends where tokens must
// hold across a restart: with it a killed server comes back with every
// lock and fence counter it had acknowledged. Without persistence a restart
// loses both, by design: another client may take a held key at once and
// tokens start again from 1 (TestServerRestartWhileHeld shows it; the
// package doc's "Failure modes" says so).
func TestChaos(t *testing.T) { runChaos(t, chaos.Family{}) }

// TestChaosSemaphore and TestChaosReadWrite are TestChaos for the lock
// families, with the same faults, for 20s (room for at least one fault before the
// last 4 TTL, which are fault-free).
func TestChaosSemaphore(t *testing.T) { runChaos(t, chaos.Semaphore(2)) }
func TestChaosReadWrite(t *testing.T) { runChaos(t, chaos.ReadWrite()) }

func runChaos(t *testing.T, f chaos.Family) {
	var srv *testserver.Server
	if os.Getenv(envChaosAddr) == "" { // the test process, not a worker
		srv = testserver.NewRedisDurable(t)
	}
	h := chaosHarness(srv)
	if f != (chaos.Family{}) {
		h.Family, h.Duration = f, 20*time.Second
	}
	if srv != nil && srv.CanControl() {
		h.Faults = append(h.Faults, testserver.ServerFaults(func() *testserver.Server { return srv }, nil)...)
	}
	r := chaos.Run(t, h)
	if r == nil {
		return // a worker process
	}
	if r.Acquired == 0 || len(r.Faults) == 0 {
		t.Errorf("the run exercised too little: %v", r)
	}
}

// chaosHarness is the harness of the single-node tests: its link faults
// act on the target worker's proxy to srv (nil in a worker process).
func chaosHarness(srv *testserver.Server) chaos.Harness {
	var links testserver.ChaosLinks
	return chaos.Harness{
		WorkerEnv: func(t *testing.T, worker int) []string {
			return []string{envChaosAddr + "=" + links.Add(t, worker, srv.Addr())[0]}
		},
		NewLocker: func(t *testing.T, w chaos.Worker) locker.Locker {
			return redis.New(chaosClient(t, w.Env(envChaosAddr)))
		},
		Faults: links.Faults(),
	}
}

// chaosClient is a worker's client: the settings redis.New's doc
// recommends (ContextTimeoutEnabled), with timeouts that let it notice a
// dead link within a TTL.
func chaosClient(t *testing.T, addr string) *goredis.Client {
	if addr == "" {
		t.Fatalf("chaos worker: %s is not set", envChaosAddr)
	}
	c := goredis.NewClient(&goredis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Second,
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
	})
	t.Cleanup(func() { _ = c.Close() }) // after the Locker's Close (chaos closes it first)
	return c
}
