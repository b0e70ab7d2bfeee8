package etcd_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/go-locker/locker/etcd"
	"github.com/go-locker/locker/integration/testserver"
)

// rpcCounter counts the requests a client sends through its KV and Lease
// interfaces (every round trip the lock code makes: Txn, Get, Put, Delete,
// Grant, Revoke, KeepAliveOnce; watches are counted apart, as streams
// opened).
type rpcCounter struct{ n atomic.Int64 }

// count swaps cli's KV and Lease for counting wrappers.
func (c *rpcCounter) count(cli *clientv3.Client) {
	cli.KV = countingKV{cli.KV, c}
	cli.Lease = countingLease{cli.Lease, c}
	cli.Watcher = countingWatcher{cli.Watcher, c}
}

type countingKV struct {
	clientv3.KV
	c *rpcCounter
}

func (k countingKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	k.c.n.Add(1)
	return k.KV.Put(ctx, key, val, opts...)
}

func (k countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	k.c.n.Add(1)
	return k.KV.Get(ctx, key, opts...)
}

func (k countingKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	k.c.n.Add(1)
	return k.KV.Delete(ctx, key, opts...)
}

func (k countingKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	k.c.n.Add(1)
	return k.KV.Do(ctx, op)
}

func (k countingKV) Txn(ctx context.Context) clientv3.Txn { return countingTxn{k.KV.Txn(ctx), k.c} }

type countingTxn struct {
	clientv3.Txn
	c *rpcCounter
}

func (t countingTxn) If(cs ...clientv3.Cmp) clientv3.Txn { return countingTxn{t.Txn.If(cs...), t.c} }
func (t countingTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	return countingTxn{t.Txn.Then(ops...), t.c}
}
func (t countingTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	return countingTxn{t.Txn.Else(ops...), t.c}
}
func (t countingTxn) Commit() (*clientv3.TxnResponse, error) {
	t.c.n.Add(1)
	return t.Txn.Commit()
}

type countingLease struct {
	clientv3.Lease
	c *rpcCounter
}

func (l countingLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	l.c.n.Add(1)
	return l.Lease.Grant(ctx, ttl)
}

func (l countingLease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	l.c.n.Add(1)
	return l.Lease.Revoke(ctx, id)
}

func (l countingLease) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	l.c.n.Add(1)
	return l.Lease.KeepAliveOnce(ctx, id)
}

type countingWatcher struct {
	clientv3.Watcher
	c *rpcCounter
}

func (w countingWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	w.c.n.Add(1)
	return w.Watcher.Watch(ctx, key, opts...)
}

// proposals reads etcd_server_proposals_committed_total (the raft entries
// the member has committed: every write, and the leader's own no-ops) from
// the member's /metrics endpoint.
func proposals(tb testing.TB, addr string) float64 {
	tb.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		tb.Fatalf("reading etcd metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "etcd_server_proposals_committed_total "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				tb.Fatalf("etcd metrics: %q: %v", line, err)
			}
			return f
		}
	}
	tb.Fatalf("etcd metrics have no etcd_server_proposals_committed_total (scan error %v)", sc.Err())
	return 0
}

// BenchmarkUncontendedInterleaved runs one Acquire+Release of the locker,
// one Lock+Unlock of etcd's concurrency.Mutex and one round of the floor
// (a Txn that puts a key on a lease, then its Delete) in turn in one loop,
// each on a client of its own straight to the server, so that all three
// see the same machine load. It reports the median of each side, the
// ratios locker/Mutex and locker/floor (of the medians), and per side the
// requests sent per cycle (KV, Lease and Watch calls, background
// keep-alives included) and the raft entries committed per cycle (from
// the server's metrics, over 20 untimed cycles of each side alone). ns/op
// is one loop (all three sides).
func BenchmarkUncontendedInterleaved(b *testing.B) {
	srv := testserver.Etcd(b)
	ctx := context.Background()
	const ttlSeconds = 10

	var lockerRPC, mutexRPC, floorRPC rpcCounter
	lcli := newEtcdClient(b, srv.Addr())
	lockerRPC.count(lcli)
	l := etcd.New(lcli)
	defer l.Close()

	mcli := newEtcdClient(b, srv.Addr())
	mutexRPC.count(mcli)
	s, err := concurrency.NewSession(mcli, concurrency.WithTTL(ttlSeconds))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()

	fcli := newEtcdClient(b, srv.Addr())
	floorRPC.count(fcli)
	// The floor's lease outlasts the benchmark without keep-alives.
	g, err := fcli.Grant(ctx, 3600)
	if err != nil {
		b.Fatal(err)
	}
	defer fcli.Revoke(context.Background(), g.ID)

	id := time.Now().UnixNano()
	key := fmt.Sprintf("bench/interleaved/%d", id)
	m := concurrency.NewMutex(s, fmt.Sprintf("/bench/interleaved-mutex/%d", id))
	floorKey := fmt.Sprintf("/bench/interleaved-floor/%d", id)

	lockerCycle := func() {
		h, err := l.Acquire(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	mutexCycle := func() {
		if err := m.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
	floorCycle := func() {
		if _, err := fcli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(floorKey), "=", 0)).
			Then(clientv3.OpPut(floorKey, "", clientv3.WithLease(g.ID))).Commit(); err != nil {
			b.Fatal(err)
		}
		if _, err := fcli.Delete(ctx, floorKey); err != nil {
			b.Fatal(err)
		}
	}
	// Raft entries per cycle of each side, measured apart (untimed): the
	// server's counter covers every client.
	lockerCycle() // the locker grants its lease on first use
	raft := map[string]float64{}
	for _, side := range []struct {
		name  string
		cycle func()
	}{{"locker", lockerCycle}, {"mutex", mutexCycle}, {"floor", floorCycle}} {
		const cycles = 20
		p0 := proposals(b, srv.Addr())
		for range cycles {
			side.cycle()
		}
		raft[side.name] = (proposals(b, srv.Addr()) - p0) / cycles
	}
	lockerT := make([]time.Duration, 0, b.N)
	mutexT := make([]time.Duration, 0, b.N)
	floorT := make([]time.Duration, 0, b.N)
	lr0, mr0, fr0 := lockerRPC.n.Load(), mutexRPC.n.Load(), floorRPC.n.Load()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		lockerCycle()
		t1 := time.Now()
		mutexCycle()
		t2 := time.Now()
		floorCycle()
		t3 := time.Now()
		lockerT = append(lockerT, t1.Sub(t0))
		mutexT = append(mutexT, t2.Sub(t1))
		floorT = append(floorT, t3.Sub(t2))
	}
	b.StopTimer()
	n := float64(b.N)
	for name, v := range raft {
		b.ReportMetric(v, name+"-raft/op")
	}
	b.ReportMetric(float64(lockerRPC.n.Load()-lr0)/n, "locker-rpcs/op")
	b.ReportMetric(float64(mutexRPC.n.Load()-mr0)/n, "mutex-rpcs/op")
	b.ReportMetric(float64(floorRPC.n.Load()-fr0)/n, "floor-rpcs/op")
	slices.Sort(lockerT)
	slices.Sort(mutexT)
	slices.Sort(floorT)
	lp, mp, fp := lockerT[len(lockerT)/2], mutexT[len(mutexT)/2], floorT[len(floorT)/2]
	b.ReportMetric(float64(lp.Nanoseconds())/1e3, "locker-p50-µs")
	b.ReportMetric(float64(mp.Nanoseconds())/1e3, "mutex-p50-µs")
	b.ReportMetric(float64(fp.Nanoseconds())/1e3, "floor-p50-µs")
	b.ReportMetric(float64(lp)/float64(mp), "locker/mutex")
	b.ReportMetric(float64(lp)/float64(fp), "locker/floor")
}
