package redlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis/redlock"
)

// lockOn reports, per node, whether the lock of key is there.
func lockOn(t *testing.T, addrs []string, key string) []bool {
	t.Helper()
	lock, _, _ := namer.KeyNames(key)
	out := make([]bool, len(addrs))
	for i, a := range admins(t, addrs) {
		n, err := a.Exists(context.Background(), lock).Result()
		if err != nil {
			t.Fatalf("node %d: EXISTS: %v", i+1, err)
		}
		out[i] = n == 1
	}
	return out
}

// A round that did not get a majority gives back what it got: when it
// returns, the nodes that granted hold no lock of it. Two ways to lose:
// another holder has the key on a majority (nodes 1 and 2 answer later than
// node 3, so node 3's grant is in before the round gives up), and a
// majority of the nodes is down.
func TestLostRoundGivesBackGrants(t *testing.T) {
	addrs := nodeAddrs(t, 3)
	adm := admins(t, addrs)
	ctx := testCtx(t, 60*time.Second)

	t.Run("HeldOnMajority", func(t *testing.T) {
		key := uniqueKey(t)
		lock, _, _ := namer.KeyNames(key)
		for _, a := range adm[:2] {
			if err := a.Set(ctx, lock, "someone-else", 30*time.Second).Err(); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			for _, a := range adm[:2] {
				a.Del(context.Background(), lock)
			}
		})
		c := newLocker(t, addrs, redlock.WithDefaultTTL(3*time.Second))
		warm(t, c.l, key)
		c.pxs[0].Latency(t, 100*time.Millisecond)
		c.pxs[1].Latency(t, 100*time.Millisecond)
		for _, call := range []string{"TryAcquire", "Acquire"} {
			var err error
			switch call {
			case "TryAcquire":
				_, err = c.l.TryAcquire(ctx, key)
			default:
				actx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
				_, err = c.l.Acquire(actx, key)
				cancel()
			}
			if err == nil {
				t.Fatalf("%s of a key held on 2 of 3 nodes succeeded", call)
			}
			if on := lockOn(t, addrs, key); on[2] {
				t.Errorf("%s lost (%v), but node 3 still holds the lock it granted", call, err)
			}
		}
	})

	t.Run("MajorityDown", func(t *testing.T) {
		key := uniqueKey(t)
		c := newLocker(t, addrs, redlock.WithDefaultTTL(3*time.Second))
		warm(t, c.l, key)
		c.pxs[0].Crash(t)
		c.pxs[1].Crash(t)
		_, err := c.l.TryAcquire(ctx, key)
		if !errors.Is(err, redlock.ErrNoQuorum) {
			t.Fatalf("TryAcquire with 2 of 3 nodes down: %v, want ErrNoQuorum", err)
		}
		if on := lockOn(t, addrs, key); on[2] {
			t.Errorf("TryAcquire lost (%v), but node 3 still holds the lock it granted", err)
		}
	})
}

// warm takes and releases a lock on every node, so that the scripts are
// loaded and the nodes vetted: later requests take one round trip each.
func warm(t *testing.T, l locker.Locker, key string) {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	h, err := l.TryAcquire(ctx, key+"/warm-up")
	if err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatalf("warm-up: %v", err)
	}
}

// An acquisition whose rounds took longer than the lease minus the drift
// allowance holds nothing it may use: the nodes granted, but by the time the
// write-back confirmed, less than the minimum validity (TTL/10) was left,
// indeed less than nothing. TryAcquire must fail with ErrNoQuorum saying
// so, Acquire must keep trying until its context ends and then fail with
// the context's error, saying why its last round failed, and neither
// leaves a lock on the nodes.
//
// TTL 9s, node timeout 3s (a third of it), drift 4.4s: each request takes
// 2.5s through the proxies (within the node timeout), so grant and
// write-back take 5s, beyond TTL − drift = 4.6s. The write-back runs only
// when no majority of the granting nodes returned one value: nodes 1 and
// 2 have their counters set ahead of node 3's, by different amounts,
// before TryAcquire, and kept so during Acquire (every round's write-back
// raises the others to the largest). A round without a
// write-back is one request, within the node timeout (at most TTL/3),
// which leaves more than the minimum validity whenever the drift is below
// TTL/2, as it must be (the dial allowance aside).
func TestAcquireSlowerThanValidity(t *testing.T) {
	addrs := nodeAddrs(t, 3)
	// Clients whose ReadTimeout is above the latency: the node timeout
	// bounds each request.
	var c client
	var cs []goredis.UniversalClient
	for _, a := range addrs {
		px := testserver.NewProxy(t, a)
		c.pxs = append(c.pxs, px)
		cl := goredis.NewClient(&goredis.Options{Addr: px.Addr(), ContextTimeoutEnabled: true, ReadTimeout: 10 * time.Second})
		t.Cleanup(func() { _ = cl.Close() })
		cs = append(cs, cl)
	}
	c.l = redlock.New(cs, redlock.WithDefaultTTL(9*time.Second), redlock.WithNodeTimeout(3*time.Second), redlock.WithDriftMargin(4400*time.Millisecond))
	if err := c.l.Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.l.Close() })
	key := uniqueKey(t)
	warm(t, c.l, key)
	adm := admins(t, addrs)
	_, fence, _ := namer.KeyNames(key)
	ctx := testCtx(t, 120*time.Second)
	for i, v := range []int{100, 200} {
		if err := adm[i].Set(ctx, fence, v, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, px := range c.pxs {
		px.Latency(t, 2500*time.Millisecond)
	}
	start := time.Now()
	h, err := c.l.TryAcquire(ctx, key)
	elapsed := time.Since(start)
	switch {
	case err == nil:
		t.Errorf("TryAcquire after %v of a 9s lease with 4.4s of drift returned a lock (token %d, valid for %v)", elapsed, h.Token(), time.Until(h.(*redlock.Handle).Validity()))
		_ = h.Release(ctx)
	case !errors.Is(err, redlock.ErrNoQuorum) || errors.Is(err, locker.ErrNotAcquired):
		t.Errorf("TryAcquire slower than its validity: %v, want ErrNoQuorum", err)
	case !strings.Contains(err.Error(), "of the 9s lease was left"):
		t.Errorf("TryAcquire slower than its validity: %v, want it to say how little of the lease was left", err)
	default:
		t.Logf("TryAcquire after %v: %v", elapsed.Round(time.Millisecond), err)
	}
	for _, px := range c.pxs {
		px.Heal(t)
	}
	if on := lockOn(t, addrs, key); on[0] || on[1] || on[2] {
		t.Errorf("lock left on the nodes after a too slow acquisition: %v", on)
	}

	for _, px := range c.pxs {
		px.Latency(t, 2500*time.Millisecond)
	}
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	// TryAcquire's write-back raised the counters to one value: set them
	// apart again before the first round, then after every round's, by
	// amounts whose sums never meet (a grant may read a counter before
	// or after a raise: node 1 after k raises must not equal node 2 after
	// k-1, nor node 3, which is never raised).
	raise := func() bool {
		for i, by := range []int64{1000, 1_000_000} {
			if err := adm[i].IncrBy(ctx, fence, by).Err(); err != nil {
				t.Errorf("raising node %d's counter: %v", i+1, err)
				return false
			}
		}
		return true
	}
	if !raise() {
		return
	}
	ahead := make(chan struct{})
	go func() {
		defer close(ahead)
		for actx.Err() == nil {
			if !raise() {
				return
			}
			select {
			case <-actx.Done():
			case <-time.After(200 * time.Millisecond): // well within a round's 2.5s requests
			}
		}
	}()
	h, err = c.l.Acquire(actx, key)
	cancel()
	<-ahead
	switch {
	case err == nil:
		t.Errorf("Acquire with every round slower than its validity returned a lock (token %d)", h.Token())
		_ = h.Release(ctx)
	case !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redlock.ErrNoQuorum):
		t.Errorf("Acquire with every round slower than its validity: %v, want its context's deadline", err)
	case !strings.Contains(err.Error(), "of the 9s lease was left"):
		t.Errorf("Acquire with every round slower than its validity: %v, want it to say why its rounds failed", err)
	default:
		t.Logf("Acquire: %v", err)
	}
	for _, px := range c.pxs {
		px.Heal(t)
	}
	// The last round's clean-up may still be on its way when Acquire
	// returns (its context ended): wait for it by the nodes' state.
	deadline := time.Now().Add(15 * time.Second)
	for on := lockOn(t, addrs, key); on[0] || on[1] || on[2]; on = lockOn(t, addrs, key) {
		if time.Now().After(deadline) {
			t.Fatalf("lock left on the nodes after Acquire gave up: %v", on)
		}
		time.Sleep(50 * time.Millisecond) // polling the servers' state: no signal to wait on
	}
}
