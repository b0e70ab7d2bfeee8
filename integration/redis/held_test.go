package redis_test

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis"
)

// heldRedis is the Held case on a Locker of its own client, whose requests
// are counted.
func heldRedis(tb testing.TB, n int) benchmark.Held {
	addr := testserver.Redis(tb).Addr()
	reqs := &requestCounter{}
	return benchmark.Held{N: n, Requests: reqs.n.Load, Open: func(tb testing.TB) locker.Locker {
		c := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: 64})
		c.AddHook(reqs)
		l := redis.New(c)
		tb.Cleanup(func() { _ = l.Close(); _ = c.Close() })
		return l
	}}
}

// TestHeldGoroutines: a Locker holding 2,000 locks runs no more goroutines
// than one holding 128.
func TestHeldGoroutines(t *testing.T) { benchmark.CheckHeldGoroutines(t, heldRedis(t, 2000)) }

// BenchmarkHeld: 10,000 locks held by one Locker (TTL 30s): goroutines
// and live heap per lock, renewal requests per second.
//
//	cd integration && go test -run '^$' -bench '^BenchmarkHeld$' -benchtime 1x ./redis
func BenchmarkHeld(b *testing.B) { benchmark.RunHeld(b, heldRedis(b, 10000)) }

// TestRenewalsBatched: the renewals of 1,000 locks held by one Locker go
// out in batches (one script per batch), not a request per lock.
func TestRenewalsBatched(t *testing.T) { benchmark.CheckRenewalsBatched(t, heldRedis(t, 1000)) }

// TestRenewalsBatchedFamilies: the same for 500 semaphore permits and 500
// readers' locks: a batch carries the families' holders too.
func TestRenewalsBatchedFamilies(t *testing.T) {
	t.Run("Semaphore", func(t *testing.T) {
		h := heldRedis(t, 500)
		h.Take = benchmark.TakeSemaphorePermit
		benchmark.CheckRenewalsBatched(t, h)
	})
	t.Run("Read", func(t *testing.T) {
		h := heldRedis(t, 500)
		h.Take = benchmark.TakeRead
		benchmark.CheckRenewalsBatched(t, h)
	})
}

// TestBatchedRenewalWrongType: one of 6 locks renewed in batches has its
// key written over from outside with a value of another type (a hash).
// Its holder learns of the loss; the batch's other locks stay held (a key
// of another type fails its own entry in the script, not the batch).
func TestBatchedRenewalWrongType(t *testing.T) {
	srv := testserver.Redis(t)
	admin := testClient(t, srv.Addr(), true)
	l := redis.New(testClient(t, srv.Addr(), true))
	t.Cleanup(func() { _ = l.Close() })
	ctx := context.Background()
	const ttl = 1500 * time.Millisecond
	hs := testserver.TakeKeys(t, l, "wrongtype", 6, ttl)
	victim := hs[2]
	lock, _, _ := l.KeyNames(victim.Key())
	if err := admin.Del(ctx, lock).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.HSet(ctx, lock, "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Del(context.Background(), lock) })
	testserver.AwaitLost(t, victim, ttl)
	testserver.StayHeld(t, hs, victim, ttl, "another lock's key became a hash")
}
