package etcd_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/go-locker/locker/etcd"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/internal/benchstats"
)

// Uncontended Acquire+Release, against concurrency.Mutex Lock+Unlock on a
// session, and against the floor: one Txn that puts a key and one Delete.
func BenchmarkUncontended(b *testing.B) {
	srv := testserver.Etcd(b)
	ctx := context.Background()
	b.Run("locker", func(b *testing.B) {
		cli := newEtcdClient(b, srv.Addr())
		l := etcd.New(cli)
		defer l.Close()
		k := fmt.Sprintf("bench/uncontended/%d", time.Now().UnixNano())
		b.ResetTimer()
		for b.Loop() {
			h, err := l.Acquire(ctx, k)
			if err != nil {
				b.Fatal(err)
			}
			if err := h.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("concurrency.Mutex", func(b *testing.B) {
		cli := newEtcdClient(b, srv.Addr())
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		m := concurrency.NewMutex(s, fmt.Sprintf("/bench/mutex/%d", time.Now().UnixNano()))
		b.ResetTimer()
		for b.Loop() {
			if err := m.Lock(ctx); err != nil {
				b.Fatal(err)
			}
			if err := m.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("floor-Txn+Delete", func(b *testing.B) {
		cli := newEtcdClient(b, srv.Addr())
		k := fmt.Sprintf("/bench/floor/%d", time.Now().UnixNano())
		b.ResetTimer()
		for b.Loop() {
			if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).Then(clientv3.OpPut(k, "")).Commit(); err != nil {
				b.Fatal(err)
			}
			if _, err := cli.Delete(ctx, k); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkHandoff measures the handoff latency, from the start of a
// release to the next waiter holding the lock, with 1, 8 and 64 waiters,
// each contender on an etcd client of its own (like separate processes),
// for the locker and concurrency.Mutex interleaved: the two sides take
// turns in phases of handoffPhase handoffs (the other side idle, every
// contender parked), so that both see the same machine load. The first
// waiters+1 handoffs of each phase, while the contenders line up, are not
// counted. Each side reports p50 and p99 of b.N handoffs in microseconds;
// ns/op is the wall time of the whole run per handoff of one side.
func BenchmarkHandoff(b *testing.B) {
	srv := testserver.Etcd(b)
	for _, n := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("waiters=%d", n), func(b *testing.B) {
			id := time.Now().UnixNano()
			lk, mk := fmt.Sprintf("bench/handoff/%d", id), fmt.Sprintf("bench/handoff-mutex/%d", id)
			sides := []*handoffSide{
				newHandoffSide(b, "locker", n, func(rc *rpcCounter) lockFuncs { return lockerContender(b, srv.Addr(), lk, rc) }),
				newHandoffSide(b, "mutex", n, func(rc *rpcCounter) lockFuncs { return mutexContender(b, srv.Addr(), mk, rc) }),
			}
			runPhases(b, handoffPhase, sides)
			for _, s := range sides {
				slices.Sort(s.gaps)
				b.ReportMetric(benchstats.Micros(benchstats.Percentile(s.gaps, 0.50)), s.name+"-p50-µs")
				b.ReportMetric(benchstats.Micros(benchstats.Percentile(s.gaps, 0.99)), s.name+"-p99-µs")
				s.reportRPCs(b)
			}
		})
	}
}

// handoffPhase is how many handoffs one side counts before the other takes
// its turn.
const handoffPhase = 100

// runPhases alternates the sides' phases of at most phase handoffs until
// each has counted b.N, which side goes first alternating.
func runPhases(b *testing.B, phase int, sides []*handoffSide) {
	for _, s := range sides {
		s.rpcs0, s.acqs0 = s.rpcs.n.Load(), s.acqs.Load()
	}
	b.ResetTimer()
	for i, done := 0, false; !done; i++ {
		done = true
		// Which side goes first alternates: a phase that starts on the
		// heels of the other side's may inherit its server work.
		for j := range sides {
			s := sides[(i+j)%len(sides)]
			if len(s.gaps) < b.N {
				s.phase(b, min(phase, b.N-len(s.gaps)))
				done = false
			}
		}
	}
	b.StopTimer()
	for _, s := range sides {
		s.stop()
	}
}

// handoffSide is one implementation's contenders in BenchmarkHandoff. Each
// contender loops: wait at the gate until the side's phase is on, lock,
// note the gap since the last release began, unlock.
type handoffSide struct {
	name    string
	n       int // contenders
	wg      sync.WaitGroup
	ctx     context.Context
	cancel  context.CancelFunc
	holding atomic.Int32 // contenders that hold the lock: never above 1
	rpcs    rpcCounter   // requests of all the side's clients
	rpcs0   int64        // rpcs when the timed run began
	acqs    atomic.Int64 // acquisitions, counted or not
	acqs0   int64

	mu       sync.Mutex
	cond     *sync.Cond
	on       bool // the phase is on
	quit     bool
	atGate   int
	skip     int // handoffs not to count yet in this phase
	quota    int // handoffs still to count in this phase
	released time.Time
	gaps     []time.Duration
	counts   []int         // counted acquisitions per contender
	first    time.Time     // of this phase's first counted acquisition
	busy     time.Duration // from first to last counted acquisition, summed over phases
	spans    int           // acquisitions after the first of each phase, summed
}

func newHandoffSide(b *testing.B, name string, waiters int, mk func(*rpcCounter) lockFuncs) *handoffSide {
	ctx, cancel := context.WithCancel(context.Background())
	s := &handoffSide{name: name, n: waiters + 1, ctx: ctx, cancel: cancel}
	s.cond = sync.NewCond(&s.mu)
	s.counts = make([]int, s.n)
	for i := range s.n {
		c := mk(&s.rpcs)
		s.wg.Add(1)
		go s.contend(b, i, c)
	}
	b.Cleanup(func() {
		s.stop()
		s.wg.Wait()
	})
	return s
}

func (s *handoffSide) contend(b *testing.B, id int, c lockFuncs) {
	defer s.wg.Done()
	for {
		s.mu.Lock()
		s.atGate++
		s.cond.Broadcast()
		for !s.on && !s.quit {
			s.cond.Wait()
		}
		s.atGate--
		if s.quit {
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		if err := c.lock(s.ctx); err != nil {
			if s.ctx.Err() == nil {
				b.Errorf("%s: lock: %v", s.name, err)
				s.stop()
			}
			return
		}
		s.acqs.Add(1)
		if s.holding.Add(1) != 1 {
			b.Errorf("%s: two holders at once", s.name)
		}
		s.mu.Lock()
		if s.on && !s.released.IsZero() {
			if s.skip > 0 {
				s.skip--
			} else {
				now := time.Now()
				s.gaps = append(s.gaps, now.Sub(s.released))
				s.counts[id]++
				if s.first.IsZero() {
					s.first = now
				} else {
					s.spans++
				}
				if s.quota--; s.quota == 0 {
					s.on = false
					s.busy += now.Sub(s.first)
				}
			}
		}
		s.released = time.Now()
		s.mu.Unlock()
		s.holding.Add(-1)
		if err := c.unlock(context.Background()); err != nil {
			b.Errorf("%s: unlock: %v", s.name, err)
			s.stop()
			return
		}
	}
}

// phase counts quota handoffs and returns once every contender is parked
// at the gate again.
func (s *handoffSide) phase(b *testing.B, quota int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.atGate < s.n && !s.quit {
		s.cond.Wait()
	}
	s.on, s.skip, s.quota, s.released, s.first = true, s.n, quota, time.Time{}, time.Time{}
	s.cond.Broadcast()
	for (s.on || s.atGate < s.n) && !s.quit {
		s.cond.Wait()
	}
	if s.quit {
		b.FailNow()
	}
}

// reportRPCs reports the side's requests (KV, Lease and Watch calls of all
// its clients, keep-alives included) per acquisition since runPhases began,
// the uncounted acquisitions at the phases' edges included.
func (s *handoffSide) reportRPCs(b *testing.B) {
	if n := s.acqs.Load() - s.acqs0; n > 0 {
		b.ReportMetric(float64(s.rpcs.n.Load()-s.rpcs0)/float64(n), s.name+"-rpcs/acq")
	}
}

// stop tells the contenders to end: those parked at the gate return, those
// in lock see their context end.
func (s *handoffSide) stop() {
	s.mu.Lock()
	s.quit = true
	s.cond.Broadcast()
	s.mu.Unlock()
	s.cancel()
}
