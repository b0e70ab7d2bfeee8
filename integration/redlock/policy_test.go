package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/redis"
	"github.com/go-locker/locker/redis/redlock"
)

// setNodePolicy sets maxmemory-policy (and maxmemory, when not "") on every
// node, restoring the values it found at the end of the test: the nodes are
// shared by the tests of this binary.
func setNodePolicy(t *testing.T, adm []*goredis.Client, policy, maxmemory string) {
	t.Helper()
	ctx := context.Background()
	for i, a := range adm {
		old, err := a.ConfigGet(ctx, "maxmemory*").Result()
		if err != nil {
			t.Fatalf("node %d: CONFIG GET: %v", i+1, err)
		}
		t.Cleanup(func() {
			for _, p := range []string{"maxmemory-policy", "maxmemory"} {
				if err := a.ConfigSet(context.Background(), p, old[p]).Err(); err != nil {
					t.Errorf("node %d: restoring %s %s: %v", i+1, p, old[p], err)
				}
			}
		})
		if err := a.ConfigSet(ctx, "maxmemory-policy", policy).Err(); err != nil {
			t.Fatalf("node %d: CONFIG SET maxmemory-policy %s: %v", i+1, policy, err)
		}
		if maxmemory != "" {
			if err := a.ConfigSet(ctx, "maxmemory", maxmemory).Err(); err != nil {
				t.Fatalf("node %d: CONFIG SET maxmemory %s: %v", i+1, maxmemory, err)
			}
		}
	}
}

// fillCache writes cache entries on every node, as ordinary cache traffic
// beside the locks would, until the node has evicted keys: under an
// allkeys-* policy at maxmemory the oldest keys go, the lock's fencing
// counters among them. It deletes what it wrote at the end of the test.
func fillCache(t *testing.T, adm []*goredis.Client, prefix string) {
	t.Helper()
	ctx := context.Background()
	blob := strings.Repeat("x", 64<<10)
	for i, a := range adm {
		before := evictedKeys(t, a)
		for j := 0; j < 2000; j++ {
			k := fmt.Sprintf("%s:%d", prefix, j)
			if err := a.Set(ctx, k, blob, 0).Err(); err != nil {
				t.Fatalf("node %d: cache write: %v", i+1, err)
			}
			if j%50 == 49 && evictedKeys(t, a) > before+100 {
				break
			}
		}
		t.Cleanup(func() {
			ks, _ := a.Keys(context.Background(), prefix+":*").Result()
			for _, k := range ks {
				a.Unlink(context.Background(), k)
			}
		})
	}
}

func evictedKeys(t *testing.T, a *goredis.Client) int64 {
	info, err := a.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "evicted_keys:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// usedMemory is the node's used_memory in bytes.
func usedMemory(t *testing.T, a *goredis.Client) int64 {
	info, err := a.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatal("no used_memory in INFO memory")
	return 0
}

// mustRefuseEviction checks that TryAcquire and Acquire on l refuse key
// because of an evicting node: an error wrapping redlock.ErrEvictionPolicy
// that names the policy, the node and the remedy, and no lock left on any
// node.
func mustRefuseEviction(t *testing.T, l locker.Locker, adm []*goredis.Client, key, policy, node string) {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	for _, call := range []struct {
		name string
		fn   func(context.Context, string, ...locker.Option) (locker.Handle, error)
	}{{"TryAcquire", l.TryAcquire}, {"Acquire", l.Acquire}} {
		h, err := call.fn(ctx, key)
		switch {
		case err == nil:
			t.Errorf("%s on nodes with maxmemory-policy %s succeeded (token %d); it must be refused", call.name, policy, h.Token())
			_ = h.Release(ctx)
		case !errors.Is(err, redlock.ErrEvictionPolicy):
			t.Errorf("%s: %v, want an error wrapping redlock.ErrEvictionPolicy", call.name, err)
		case !errors.Is(err, locker.ErrUnsafeConfig):
			t.Errorf("%s: %v, want an error wrapping locker.ErrUnsafeConfig", call.name, err)
		case !errors.Is(err, redis.ErrEvictionPolicy):
			t.Errorf("%s: %v does not wrap redis.ErrEvictionPolicy: one check for both packages", call.name, err)
		case !strings.Contains(err.Error(), `"`+policy+`"`) || !strings.Contains(err.Error(), node) || !strings.Contains(err.Error(), "noeviction"):
			t.Errorf("%s: %q must name the policy %s, the node %s and say to set noeviction", call.name, err, policy, node)
		case errors.Is(err, locker.ErrNotAcquired):
			t.Errorf("%s: %v must not wrap ErrNotAcquired: nobody holds the key", call.name, err)
		}
	}
	lock, _, _ := namer.KeyNames(key)
	for i, a := range adm {
		if n, err := a.Exists(ctx, lock).Result(); err != nil || n != 0 {
			t.Errorf("node %d: lock key after a refusal: EXISTS = %d, %v; want 0", i+1, n, err)
		}
	}
}

// TestEvictingNodesRefused: a Redlock whose nodes may evict keys
// (maxmemory-policy other than noeviction) refuses to take locks, as the
// single-node backend does, with the same check: an evicted fencing counter
// starts again at 1, so the next holder's token would be below the last
// one's (on ce815f6, which did not check: previous holder token 5, next
// holder token 1). One evicting node is enough to refuse; fixing it takes
// effect at the next acquire; WithAllowEviction (allow_eviction=true) turns
// the check off, at that price.
func TestEvictingNodesRefused(t *testing.T) {
	addrs := nodeAddrs(t, 3)
	adm := admins(t, addrs)
	// Headroom of 4MB above what each node holds now: the cache traffic
	// below fills it and evicts.
	var maxmem int64
	for _, a := range adm {
		maxmem = max(maxmem, usedMemory(t, a)+4<<20)
	}
	setNodePolicy(t, adm, "allkeys-lru", strconv.FormatInt(maxmem, 10))
	c := newLocker(t, addrs)
	ctx := testCtx(t, 60*time.Second)
	key := uniqueKey(t)
	mustRefuseEviction(t, c.l, adm, key, "allkeys-lru", c.pxs[0].Addr())

	// One node of three evicting: still refused, naming that node.
	for _, a := range adm[:2] {
		if err := a.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
			t.Fatal(err)
		}
	}
	c2 := newLocker(t, addrs)
	l2 := c2.l
	// The Locker's errors name its nodes as it reaches them: the proxies.
	mustRefuseEviction(t, l2, adm, key, "allkeys-lru", c2.pxs[2].Addr())
	// Fixed: the same Locker takes the lock at its next acquire.
	if err := adm[2].ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	h, err := l2.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire once every node is noeviction: %v", err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The opt-out, with a node that evicts: locks are taken, and cache
	// traffic on the nodes can send tokens backwards (logged: how far
	// depends on what Redis evicts).
	for _, a := range adm {
		if err := a.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
			t.Fatal(err)
		}
	}
	allowed := newLocker(t, addrs, redlock.WithAllowEviction(true)).l
	u := "redlock://" + strings.Join(addrs, ",") + "?allow_eviction=true"
	fromURL, err := locker.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer fromURL.Close()
	if h, err := fromURL.TryAcquire(ctx, key); err != nil {
		t.Errorf("TryAcquire through %s under allkeys-lru: %v", u, err)
	} else if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var last int64
	for range 5 {
		h, err := allowed.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("TryAcquire with WithAllowEviction under allkeys-lru: %v", err)
		}
		last = h.Token()
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	fillCache(t, adm, "cache/"+t.Name())
	h, err = allowed.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("after cache traffic: %v", err)
	}
	defer h.Release(ctx)
	t.Logf("WithAllowEviction: previous holder's token %d, next holder's after cache traffic evicted keys %d", last, h.Token())
}
