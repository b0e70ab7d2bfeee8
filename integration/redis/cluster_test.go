package redis_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis"
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
	a := redis.New(c, redis.WithRetryInterval(retry))
	b := redis.New(c, redis.WithRetryInterval(retry))
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })

	// Pick keys until every master owns at least two.
	perMaster := map[string][]string{}
	for i := 0; len(perMaster) < 3 || minLen(perMaster) < 2; i++ {
		if i > 1000 {
			t.Fatalf("keys landed on %d masters only", len(perMaster))
		}
		key := fmt.Sprintf("cluster/%s/%d{}", t.Name(), i) // braces in user keys are harmless
		lock, fence, wake := a.KeyNames(key)
		m, err := c.MasterForKey(ctx, lock)
		if err != nil {
			t.Fatal(err)
		}
		// The families' names (semaphore, reader-writer lock) share the
		// slot too, and their scripts run there.
		others := []string{fence, wake}
		for _, fam := range []string{"sem", "rw"} {
			others = append(others, famName(a, fam, key, "holders"), famName(a, fam, key, "queue"), famWake(a, fam, key))
		}
		for _, other := range others {
			if s1, s2 := c.ClusterKeySlot(ctx, lock).Val(), c.ClusterKeySlot(ctx, other).Val(); s1 != s2 {
				t.Fatalf("%q and %q are on slots %d and %d", lock, other, s1, s2)
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
			// The key's master is the witness that the waiter listens
			// for the release.
			lock, _, wake := b.KeyNames(key)
			if m, err := c.MasterForKey(ctx, lock); err != nil {
				t.Errorf("MasterForKey(%q): %v", lock, err)
			} else if err := shardSubscribed(ctx, m, []string{wake}); err != nil {
				t.Errorf("%q: %v", key, err)
			}
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
	ls := []*redis.Locker{redis.New(c), redis.New(c)}
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

// TestConformanceCluster runs the suite on the cluster. A cluster client
// learns the nodes' own addresses from CLUSTER SLOTS (and MOVED/ASK
// redirects), so a proxy in front of one seed address would be bypassed.
// Instead each Locker gets its own client whose Dialer sends every
// connection to a node (commands, slot-map reloads and Pub/Sub alike: the
// cluster's node clients and their Pub/Sub pools all dial through
// ClusterOptions.Dialer) through that Locker's own proxy for the node; Cut
// blackholes all of them, and Crash kills all of them.
func TestConformanceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	nodes := testserver.RedisCluster(t)
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr()
	}
	var (
		mu      sync.Mutex
		proxies = map[locker.Locker]*clusterProxies{}
	)
	proxyOf := func(l locker.Locker) *clusterProxies {
		mu.Lock()
		defer mu.Unlock()
		return proxies[l]
	}
	admin := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = admin.Close() })
	namer := redis.New(admin) // only for KeyNames: the default prefix, as the harness's Lockers
	seeds := url.Values{"addr": addrs[1:]}
	conformance.Run(t, conformance.Harness{
		IgnoreGoroutines: testserver.ProxyGoroutines,
		NewLocker: func(t *testing.T) locker.Locker {
			cp := newClusterProxies(t, addrs)
			c := goredis.NewClusterClient(&goredis.ClusterOptions{
				Addrs:                 addrs,
				Dialer:                cp.dial,
				ContextTimeoutEnabled: true,
				// A blackholed proxy must not keep a test waiting for long.
				DialTimeout: 2 * time.Second,
				ReadTimeout: 2 * time.Second,
			})
			l := redis.New(c)
			t.Cleanup(func() {
				_ = l.Close()
				_ = c.Close()
				cp.check(t)
			})
			mu.Lock()
			proxies[l] = cp
			mu.Unlock()
			return l
		},
		// A killed process: every connection of its client ends, and no
		// node accepts it again; its locks stay until their lease runs out.
		Crash: func(t *testing.T, l locker.Locker) {
			cp := proxyOf(l)
			cp.check(t)
			for _, px := range cp.byAddr {
				px.Crash(t)
			}
		},
		// Every connection of the client, to every master, closed from
		// outside; it reconnects.
		Reset: func(t *testing.T, l locker.Locker) {
			cp := proxyOf(l)
			cp.check(t)
			for _, px := range cp.byAddr {
				px.ResetAll(t)
			}
		},
		Cut: func(t *testing.T, l locker.Locker) func() {
			cp := proxyOf(l)
			cp.check(t)
			for _, px := range cp.byAddr {
				px.Blackhole(t)
			}
			return func() {
				for _, px := range cp.byAddr {
					px.Heal(t)
				}
			}
		},
		// An eviction, a failover to a replica that missed the write, or an
		// operator: the lock key vanishes from its master.
		Steal: func(t *testing.T, h locker.Handle) {
			lock, _, _ := namer.KeyNames(h.Key())
			if err := admin.Del(context.Background(), lock).Err(); err != nil {
				t.Fatalf("Steal: DEL %s: %v", lock, err)
			}
		},
		URL:            "redis+cluster://" + addrs[0] + "?" + seeds.Encode(),
		TTL:            2 * time.Second,
		NoInspectLease: "a Redis lock key keeps its remaining expiry (PTTL), not the lease it was set with",
	})
}

// clusterProxies is one Locker's connection path to the cluster: a proxy
// per node, chosen by the address the client dials.
type clusterProxies struct {
	byAddr map[string]*testserver.Proxy // fixed after construction

	mu      sync.Mutex
	unknown []string // addresses dialled that have no proxy
}

func newClusterProxies(t testing.TB, addrs []string) *clusterProxies {
	t.Helper()
	cp := &clusterProxies{byAddr: map[string]*testserver.Proxy{}}
	for _, a := range addrs {
		cp.byAddr[a] = testserver.NewProxy(t, a)
	}
	return cp
}

// dial is the client's ClusterOptions.Dialer. An address without a proxy is
// refused, not dialled directly: such a connection would survive a Cut.
func (cp *clusterProxies) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	px := cp.byAddr[addr]
	if px == nil {
		cp.mu.Lock()
		cp.unknown = append(cp.unknown, addr)
		cp.mu.Unlock()
		return nil, fmt.Errorf("cluster test dialer: no proxy for node address %q (known: %v)", addr, cp.known())
	}
	var d net.Dialer
	return d.DialContext(ctx, network, px.Addr())
}

func (cp *clusterProxies) known() []string {
	var out []string
	for a := range cp.byAddr {
		out = append(out, a)
	}
	return out
}

// check fails t if the client ever dialled an address without a proxy (the
// dialer runs on the client's goroutines, where it cannot fail t itself).
func (cp *clusterProxies) check(t testing.TB) {
	t.Helper()
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if len(cp.unknown) > 0 {
		t.Fatalf("cluster client dialled node addresses with no proxy in front: %v (known: %v); a Cut would not cut them", cp.unknown, cp.known())
	}
}

// TestClusterWaitersSurviveReconnect: the Pub/Sub connections of a waiting
// Locker are killed; waiters on several slots of one master must still be
// woken by the next releases.
func TestClusterWaitersSurviveReconnect(t *testing.T) {
	c := clusterClient(t)
	ctx := testCtx(t)
	const retry = time.Minute
	waiter := redis.New(c, redis.WithRetryInterval(retry))
	holder := redis.New(c)
	t.Cleanup(func() { _ = waiter.Close(); _ = holder.Close() })

	// Three keys on one master, on different slots.
	var keys []string
	var master *goredis.Client
	slots := map[int64]bool{}
	for i := 0; len(keys) < 3; i++ {
		key := fmt.Sprintf("%s/%d", uniqueKey(t), i)
		_, _, wake := waiter.KeyNames(key)
		m, err := c.MasterForKey(ctx, wake)
		if err != nil {
			t.Fatal(err)
		}
		slot := c.ClusterKeySlot(ctx, wake).Val()
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
	var channels []string
	for _, key := range keys {
		_, _, wake := waiter.KeyNames(key)
		channels = append(channels, wake)
	}
	// The server is the witness: every waiter is subscribed before the kill,
	// and subscribed again (on a new connection) before the release.
	waitShardSubscribed(t, ctx, master, channels)
	if err := master.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	waitShardSubscribed(t, ctx, master, channels)
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

// waitShardSubscribed waits until each channel has a shard subscriber on
// node, as the server reports it (PUBSUB SHARDNUMSUB), or fails at ctx's end.
func waitShardSubscribed(t *testing.T, ctx context.Context, node *goredis.Client, channels []string) {
	t.Helper()
	if err := shardSubscribed(ctx, node, channels); err != nil {
		t.Fatal(err)
	}
}

// shardSubscribed is waitShardSubscribed for goroutines other than the
// test's: it returns the failure instead.
func shardSubscribed(ctx context.Context, node *goredis.Client, channels []string) error {
	for {
		counts, err := node.PubSubShardNumSub(ctx, channels...).Result()
		if err != nil {
			return fmt.Errorf("PUBSUB SHARDNUMSUB: %w", err)
		}
		all := true
		for _, ch := range channels {
			if counts[ch] < 1 {
				all = false
			}
		}
		if all {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("channels %v not all subscribed on %s: %v", channels, node.Options().Addr, counts)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
