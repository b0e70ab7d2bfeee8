package redlock_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

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

// TestEvictingNodesRefused: a Redlock whose nodes may evict keys
// (maxmemory-policy other than noeviction) must refuse to take locks, as
// the single-node backend does: an evicted fencing counter starts again at
// 1, so the next holder's token is below the last one's.
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
	l := newLocker(t, addrs).l
	ctx := testCtx(t, 60*time.Second)
	key := uniqueKey(t)

	var last int64
	for range 5 {
		h, err := l.TryAcquire(ctx, key)
		if err != nil {
			if strings.Contains(err.Error(), "maxmemory-policy") {
				t.Logf("refused: %v", err)
				return
			}
			t.Fatalf("TryAcquire under allkeys-lru: %v, want a refusal naming maxmemory-policy", err)
		}
		last = h.Token()
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Errorf("TryAcquire on nodes with maxmemory-policy allkeys-lru succeeded 5 times (last token %d); it must be refused", last)
	fillCache(t, adm, "cache/"+t.Name())
	h, err := l.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("after cache traffic: %v", err)
	}
	defer h.Release(ctx)
	if h.Token() <= last {
		t.Errorf("tokens went backwards: previous holder %d, next holder %d (the nodes evicted the fencing counters)", last, h.Token())
	}
}

var _ = redlock.DefaultPrefix
