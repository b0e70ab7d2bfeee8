package redis_test

import (
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis"
)

// TestAcquireSlowerThanLease: a grant whose answer comes back after its
// lease ran out (a slow link) is not handed out: the Locker gives it back
// and tries again, and the Handle it returns is held, on the server too.
// Before issue 27's fix Acquire returned the late grant: a Handle already
// lost, whose key another client could take at once.
func TestAcquireSlowerThanLease(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	const ttl = time.Second
	px := testserver.NewProxy(t, srv.Addr())
	l := newTestLocker(t, px.Addr())
	admin := testClient(t, srv.Addr(), true)
	other := newTestLocker(t, srv.Addr())
	k := uniqueKey(t)
	warm := mustGet(t, ctx, l, k+"/warm") // connections and scripts are ready
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lockKey, _, _ := l.KeyNames(k)
	px.Latency(t, 3*ttl/2) // every answer arrives after the lease it grants ran out
	type result struct {
		h   locker.Handle
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := l.Acquire(ctx, k, locker.WithTTL(ttl))
		done <- result{h, err}
	}()
	// Wait until the server has granted the key once (its answer is on its
	// way, late).
	for {
		n, err := admin.Exists(ctx, lockKey).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("Acquire returned before any answer could arrive: %v, %v", r.h, r.err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	// The fault itself: keep the link slow for two answers' time, long
	// enough for the late answer to come back (and, without the fix, be
	// handed out).
	var r result
	select {
	case r = <-done:
	case <-time.After(3 * ttl):
		px.Heal(t)
		r = <-done
	}
	px.Heal(t)
	if r.err != nil {
		t.Fatalf("Acquire after a late grant: %v", r.err)
	}
	defer r.h.Release(ctx)
	if err := r.h.Err(); err != nil {
		t.Errorf("Acquire handed out a Handle already ended: %v", err)
	}
	owner, err := admin.Get(ctx, lockKey).Result()
	if errors.Is(err, goredis.Nil) || owner != r.h.(*redis.Handle).Owner() {
		t.Errorf("the lock on the server is %q (%v), want the Handle's owner %q", owner, err, r.h.(*redis.Handle).Owner())
	}
	if h, err := other.TryAcquire(ctx, k); err == nil {
		_ = h.Release(ctx)
		t.Errorf("another client took the key while the Handle holds it")
	}
}
