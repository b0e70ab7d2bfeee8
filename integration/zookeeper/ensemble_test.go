package zookeeper_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/conformance/chaos"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/zookeeper"
)

// ensembleClient is a Locker whose connection knows every server of an
// ensemble, each through a proxy of its own: go-zookeeper moves the
// session to another server when its server goes.
type ensembleClient struct {
	l   *zookeeper.Locker
	pxs []*testserver.Proxy
}

func newEnsembleClient(t testing.TB, ms []*testserver.Server, opts ...zookeeper.Option) ensembleClient {
	t.Helper()
	var pxs []*testserver.Proxy
	var addrs []string
	for _, m := range ms {
		px := testserver.NewProxy(t, m.Addr())
		pxs = append(pxs, px)
		addrs = append(addrs, px.Addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := zookeeper.Connect(ctx, addrs, opts...)
	if err != nil {
		t.Fatalf("zookeeper.Connect: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return ensembleClient{l, pxs}
}

func ensembleAddrs(ms []*testserver.Server) []string {
	var addrs []string
	for _, m := range ms {
		addrs = append(addrs, m.Addr())
	}
	return addrs
}

// TestEnsembleConformance: the whole suite on a 3-server ensemble, each
// Locker connected to all three.
func TestEnsembleConformance(t *testing.T) {
	ms := testserver.ZooKeeperEnsemble(t)
	addrs := ensembleAddrs(ms)
	admin := adminConn(t, addrs[0])
	var reg testserver.Registry[[]*testserver.Proxy]
	conformance.Run(t, conformance.Harness{
		IgnoreGoroutines: testserver.ProxyGoroutines,
		NewLocker: func(t *testing.T) locker.Locker {
			c := newEnsembleClient(t, ms)
			reg.Put(c.l, c.pxs)
			return c.l
		},
		Crash: func(t *testing.T, l locker.Locker) {
			for _, px := range reg.Get(t, l, "Crash") {
				px.Crash(t)
			}
		},
		Cut: func(t *testing.T, l locker.Locker) func() {
			pxs := reg.Get(t, l, "Cut")
			for _, px := range pxs {
				px.Blackhole(t)
			}
			return func() {
				for _, px := range pxs {
					px.Heal(t)
				}
			}
		},
		Reset: func(t *testing.T, l locker.Locker) {
			for _, px := range reg.Get(t, l, "Reset") {
				px.ResetAll(t)
			}
		},
		Steal: func(t *testing.T, h locker.Handle) {
			if err := admin.Delete(h.(*zookeeper.Handle).Node(), -1); err != nil {
				t.Fatalf("Steal: delete %s: %v", h.(*zookeeper.Handle).Node(), err)
			}
		},
		LossBound:      time.Second,
		URL:            "zookeeper://" + strings.Join(addrs, ",") + "/locker?ttl=" + sessionTimeout.String(),
		TTL:            2 * time.Second,
		LeaseFloor:     time.Second,
		LeaseCeiling:   10 * time.Second,
		NoInspectLease: "a node's stat names its session, not the session's timeout",
		ExpiryBound:    2 * sessionTimeout,
		ExpirySlack:    time.Second,
		CtxSlack:       1200 * time.Millisecond,
	})
}

// TestEnsembleLeaderKilledHolderKeepsLock: a holder keeps its lock when
// the leader is killed: the others elect a new leader within the session
// timeout, go-zookeeper moves the session to a surviving server (a
// follower that lost its leader drops its clients until the election
// ends), and the session (with the lock's node) survives. A
// waiter meanwhile does not get the key; after the holder releases, it
// does, with a greater token.
func TestEnsembleLeaderKilledHolderKeepsLock(t *testing.T) {
	ms := testserver.ZooKeeperEnsemble(t)
	for _, m := range ms {
		if !m.CanControl() {
			t.Skip("the ensemble comes from the environment: this test kills its leader")
		}
	}
	leader := testserver.ZooKeeperLeader(t, ms)
	// Wherever the holder's session is, the leader's death moves it: the
	// followers stop serving clients until they have a new leader.
	holder := newEnsembleClient(t, ms, zookeeper.WithDefaultTTL(6*time.Second))
	waiter := newEnsembleClient(t, others(ms, leader))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	key := testKey(t)
	h, err := holder.l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan locker.Handle, 1)
	go func() {
		wh, err := waiter.l.Acquire(ctx, key)
		if err != nil {
			t.Errorf("waiter: %v", err)
			close(got)
			return
		}
		got <- wh
	}()
	t.Cleanup(func() { leader.Start(t); testserver.ZooKeeperLeader(t, ms) })
	leader.Kill(t)
	newLeader := testserver.ZooKeeperLeader(t, others(ms, leader))
	t.Logf("leader %s killed; %s leads now", leader, newLeader)
	// The holder's session must have moved and still be alive: a read
	// through the Locker shows its node still there, once its connection
	// is back (go-zookeeper fails calls while it looks for a server that
	// serves: "could not connect to a server").
	var info locker.LockInfo
	for deadline := time.Now().Add(10 * time.Second); ; {
		if info, err = holder.l.Inspect(ctx, key); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("Inspect after the leader's death, for 10s: %v", err)
	}
	if !info.Held || info.Token != h.Token() {
		t.Fatalf("after the leader's death the key is %+v; want held by the holder (token %d)", info, h.Token())
	}
	select {
	case <-h.Done():
		t.Fatalf("the holder lost its lock when the leader died: %v", h.Err())
	case wh := <-got:
		t.Fatalf("the waiter got the key (token %d) while the holder held it", wh.Token())
	default:
	}
	if err := h.Release(ctx); err != nil {
		t.Fatalf("Release after the failover: %v", err)
	}
	wh, ok := <-got
	if !ok {
		return
	}
	if wh.Token() <= h.Token() {
		t.Errorf("token after the failover %d, not above the holder's %d", wh.Token(), h.Token())
	}
	_ = wh.Release(ctx)
}

func others(ms []*testserver.Server, not *testserver.Server) []*testserver.Server {
	var out []*testserver.Server
	for _, m := range ms {
		if m != not {
			out = append(out, m)
		}
	}
	return out
}

// envChaosEnsemble hands a chaos worker process the addresses of its fault
// proxies to the ensemble's servers.
const envChaosEnsemble = "LOCKER_CHAOS_ZOOKEEPER_ENSEMBLE"

// TestChaosEnsemble runs the chaos suite on a 3-server ensemble: worker
// processes, two knowing every server and the others one server each (so
// that a fault on that server cuts them off), while the nemesis pauses the
// leader (an election follows), kills and restarts the leader, pauses a
// follower, stops holder processes past their session (built in) and cuts,
// blackholes or slows the links of one worker. A quorum decides every
// change: one holder at a time and rising tokens must hold through all of
// them.
func TestChaosEnsemble(t *testing.T) {
	var (
		ms    []*testserver.Server
		links testserver.ChaosLinks
		mu    sync.Mutex
		down  *testserver.Server
		how   string
	)
	fault := func(t *testing.T, m *testserver.Server, kill bool) func() {
		mu.Lock()
		down, how = m, "pause"
		if kill {
			how = "kill"
		}
		mu.Unlock()
		if kill {
			m.Kill(t)
		} else {
			m.Pause(t)
		}
		return func() {
			if kill {
				m.Start(t)
			} else {
				m.Resume(t)
			}
			mu.Lock()
			down = nil
			mu.Unlock()
			testserver.ZooKeeperLeader(t, ms)
		}
	}
	faults := []chaos.Fault{
		{Name: "leader-pause", Inject: func(t *testing.T, _ chaos.Target) func() {
			return fault(t, testserver.ZooKeeperLeader(t, ms), false)
		}},
		{Name: "leader-restart", Inject: func(t *testing.T, _ chaos.Target) func() {
			return fault(t, testserver.ZooKeeperLeader(t, ms), true)
		}},
		{Name: "follower-pause", Inject: func(t *testing.T, tg chaos.Target) func() {
			fs := others(ms, testserver.ZooKeeperLeader(t, ms))
			return fault(t, fs[tg.Worker%len(fs)], false)
		}},
	}
	r := chaos.Run(t, chaos.Harness{
		TTL:      chaosEnsembleTTL,
		Duration: time.Minute, // room for several faults of 1–3 TTL before the last 4 TTL
		WorkerEnv: func(t *testing.T, w int) []string {
			if ms == nil {
				ms = testserver.ZooKeeperEnsemble(t)
				for _, m := range ms {
					if !m.CanControl() {
						t.Skip("the ensemble comes from the environment: the chaos test needs servers it can pause and kill")
					}
				}
				testserver.ZooKeeperLeader(t, ms)
				// Leave the shared ensemble as it was found, also when the
				// test stops in the middle of a fault.
				t.Cleanup(func() {
					mu.Lock()
					m, h := down, how
					mu.Unlock()
					switch h {
					case "pause":
						if m != nil {
							m.Resume(t)
						}
					case "kill":
						if m != nil {
							m.Start(t)
						}
					}
					testserver.ZooKeeperLeader(t, ms)
				})
			}
			dial := ms
			if w >= 2 {
				dial = ms[(w-2)%len(ms) : (w-2)%len(ms)+1]
			}
			return []string{envChaosEnsemble + "=" + strings.Join(links.Add(t, w, ensembleAddrs(dial)...), ",")}
		},
		NewLocker: func(t *testing.T, w chaos.Worker) locker.Locker {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			l, err := zookeeper.Connect(ctx, strings.Split(w.Env(envChaosEnsemble), ","),
				zookeeper.WithDefaultTTL(chaosEnsembleTTL))
			if err != nil {
				t.Fatalf("zookeeper.Connect: %v", err)
			}
			return l
		},
		Faults: append(faults, links.Faults()...),
	})
	if r == nil {
		return // a worker process
	}
	if r.Acquired == 0 || len(r.Faults) == 0 {
		t.Errorf("the run exercised too little: %v", r)
	}
}

// chaosEnsembleTTL is the session timeout of the ensemble's chaos workers:
// long enough that a session can outlive an election (tickTime 500ms) and
// move to another server, short enough for many holds in a run.
const chaosEnsembleTTL = 3 * time.Second
