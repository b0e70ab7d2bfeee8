package redis

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/internal/testserver"
)

func clusterClient(t testing.TB) *goredis.ClusterClient {
	t.Helper()
	nodes := testserver.RedisCluster(t)
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr()
	}
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestClusterSlots: keys spread over every master; on each, the scripts
// (which touch the lock and the counter in one call) work, waiters are woken
// by sharded Pub/Sub on the key's master, and exclusion holds.
func TestClusterSlots(t *testing.T) {
	c := clusterClient(t)
	ctx := testCtx(t)
	const retry = time.Minute // only a notification may wake waiters quickly
	a := New(c, WithRetryInterval(retry))
	b := New(c, WithRetryInterval(retry))
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })

	// Pick keys until every master owns at least two.
	perMaster := map[string][]string{}
	for i := 0; len(perMaster) < 3 || minLen(perMaster) < 2; i++ {
		if i > 1000 {
			t.Fatalf("keys landed on %d masters only", len(perMaster))
		}
		key := fmt.Sprintf("cluster/%s/%d{}", t.Name(), i) // braces in user keys are harmless
		k := a.keysFor(key)
		m, err := c.MasterForKey(ctx, k.lock)
		if err != nil {
			t.Fatal(err)
		}
		for _, other := range []string{k.fence, k.wake} {
			if s1, s2 := c.ClusterKeySlot(ctx, k.lock).Val(), c.ClusterKeySlot(ctx, other).Val(); s1 != s2 {
				t.Fatalf("%q and %q are on slots %d and %d", k.lock, other, s1, s2)
			}
		}
		addr := m.Options().Addr
		perMaster[addr] = append(perMaster[addr], key)
	}
	var keys []string
	for _, ks := range perMaster {
		keys = append(keys, ks...)
	}
	t.Logf("%d keys on %d masters", len(keys), len(perMaster))

	var wg sync.WaitGroup
	for _, key := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := a.Acquire(ctx, key)
			if err != nil {
				t.Errorf("Acquire(%q): %v", key, err)
				return
			}
			got := make(chan time.Time, 1)
			go func() {
				wh, err := b.Acquire(ctx, key)
				got <- time.Now()
				if err != nil {
					t.Errorf("waiting Acquire(%q): %v", key, err)
					return
				}
				if wh.Token() <= h.Token() {
					t.Errorf("%q: token %d after %d", key, wh.Token(), h.Token())
				}
				_ = wh.Release(ctx)
			}()
			time.Sleep(300 * time.Millisecond)
			if _, err := b.TryAcquire(ctx, key); err == nil {
				t.Errorf("%q: TryAcquire succeeded while held", key)
			}
			released := time.Now()
			if err := h.Release(ctx); err != nil {
				t.Errorf("Release(%q): %v", key, err)
			}
			if took := (<-got).Sub(released); took > time.Second {
				t.Errorf("%q: waiter took %v after the release; sharded Pub/Sub should wake it at once", key, took)
			}
		}()
	}
	wg.Wait()
}

func minLen(m map[string][]string) int {
	n := -1
	for _, v := range m {
		if n < 0 || len(v) < n {
			n = len(v)
		}
	}
	return n
}

// TestClusterExclusion: many goroutines on two Lockers contend for one key
// on the cluster; never two inside at once.
func TestClusterExclusion(t *testing.T) {
	c := clusterClient(t)
	ctx := testCtx(t)
	ls := []*Locker{New(c), New(c)}
	t.Cleanup(func() {
		for _, l := range ls {
			_ = l.Close()
		}
	})
	key := uniqueKey(t)
	var inside, total atomic.Int32
	var last atomic.Int64
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				h, err := ls[i%2].Acquire(ctx, key)
				if err != nil {
					t.Error(err)
					return
				}
				if inside.Add(1) != 1 {
					t.Error("two holders at once")
				}
				if tok := h.Token(); tok <= last.Load() {
					t.Errorf("token %d not above %d", tok, last.Load())
				} else {
					last.Store(tok)
				}
				total.Add(1)
				inside.Add(-1)
				if err := h.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if total.Load() != 160 {
		t.Errorf("%d acquisitions, want 160", total.Load())
	}
}

// TestConformanceCluster runs the suite on the cluster. Cut is left out: a
// cluster client learns the nodes' own addresses from CLUSTER SLOTS and
// would bypass a proxy.
func TestConformanceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	nodes := testserver.RedisCluster(t)
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr()
	}
	conformance.Run(t, conformance.Harness{
		NewLocker: func(t *testing.T) locker.Locker {
			c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
			l := New(c)
			t.Cleanup(func() { _ = l.Close(); _ = c.Close() })
			return l
		},
		Crash: func(t *testing.T, l locker.Locker) {
			rl := l.(*Locker)
			rl.crash()
			_ = rl.client.Close()
		},
		TTL:    2 * time.Second,
		MinTTL: MinTTL,
	})
}

var _ = context.Background

// TestClusterWaitersSurviveReconnect: the Pub/Sub connections of a waiting
// Locker are killed; waiters on several slots of one master must still be
// woken by the next releases.
func TestClusterWaitersSurviveReconnect(t *testing.T) {
	c := clusterClient(t)
	ctx := testCtx(t)
	const retry = time.Minute
	waiter := New(c, WithRetryInterval(retry))
	holder := New(c)
	t.Cleanup(func() { _ = waiter.Close(); _ = holder.Close() })

	// Three keys on one master, on different slots.
	var keys []string
	var master *goredis.Client
	slots := map[int64]bool{}
	for i := 0; len(keys) < 3; i++ {
		key := fmt.Sprintf("%s/%d", uniqueKey(t), i)
		k := waiter.keysFor(key)
		m, err := c.MasterForKey(ctx, k.wake)
		if err != nil {
			t.Fatal(err)
		}
		slot := c.ClusterKeySlot(ctx, k.wake).Val()
		if master == nil {
			master = m
		}
		if m.Options().Addr == master.Options().Addr && !slots[slot] {
			slots[slot] = true
			keys = append(keys, key)
		}
	}
	var handles []locker.Handle
	got := make(chan time.Time, len(keys))
	for _, key := range keys {
		handles = append(handles, mustGet(t, ctx, holder, key, locker.WithTTL(time.Minute)))
		go func() {
			wh, err := waiter.Acquire(ctx, key)
			got <- time.Now()
			if err == nil {
				_ = wh.Release(ctx)
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	if err := master.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // reconnect and resubscribe
	released := time.Now()
	for _, h := range handles {
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range keys {
		select {
		case at := <-got:
			if d := at.Sub(released); d > 2*time.Second {
				t.Errorf("waiter woke %v after the release", d)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("waiter not woken within 10s of the release after its Pub/Sub connection was killed")
		}
	}
}
