package redlock_test

import (
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis/redlock"
)

// A release whose reply is lost on a majority of the nodes, and which
// go-redis therefore sends again on a new connection, still counts as
// released there: the nodes remember the release for a few seconds, so the
// retry, which finds the lock gone, is not taken for a lock lost to
// expiry. Without the record, Release reported locker.ErrLost for a lock it
// had released on every node.
func TestReleaseRetriedAfterLostReply(t *testing.T) {
	addrs := nodeAddrs(t, 3)
	adm := admins(t, addrs)
	var cs []goredis.UniversalClient
	var pxs []*testserver.Proxy
	for _, a := range addrs {
		px := testserver.NewProxy(t, a)
		pxs = append(pxs, px)
		c := goredis.NewClient(&goredis.Options{
			Addr:                  px.Addr(),
			ContextTimeoutEnabled: true,
			DialTimeout:           2 * time.Second,
			// A retry waits long enough for the test to heal the path
			// after cutting the connection that carried the first attempt.
			MinRetryBackoff: 400 * time.Millisecond,
			MaxRetryBackoff: 500 * time.Millisecond,
		})
		t.Cleanup(func() { _ = c.Close() })
		cs = append(cs, c)
	}
	// A 30s TTL gives a node timeout of 3s: room for the retry.
	l := redlock.New(cs, redlock.WithDefaultTTL(30*time.Second))
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	ctx := testCtx(t, 30*time.Second)
	key := uniqueKey(t)
	// Load the scripts on every node first (a first EVALSHA is answered
	// NOSCRIPT, and go-redis sends the script itself).
	warm, err := l.Acquire(ctx, key+"/warm-up")
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	h, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	lock, _, _ := l.KeyNames(key)

	// Nodes 1 and 2 run the release, but their replies are held back.
	pxs[0].Latency(t, 20*time.Second)
	pxs[1].Latency(t, 20*time.Second)
	res := make(chan error, 1)
	go func() { res <- h.Release(ctx) }()
	for _, a := range adm[:2] {
		for {
			n, err := a.Exists(ctx, lock).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			time.Sleep(2 * time.Millisecond) // polling the server's state: no signal to wait on
		}
	}
	// The replies are lost with their connections; go-redis retries on
	// new ones, which pass at once.
	pxs[0].ResetAll(t)
	pxs[1].ResetAll(t)
	pxs[0].Heal(t)
	pxs[1].Heal(t)
	if err := <-res; err != nil {
		t.Fatalf("Release whose replies were lost and retried: %v", err)
	}
	for i, a := range adm {
		if n, err := a.Exists(ctx, lock).Result(); err != nil || n != 0 {
			t.Errorf("node %d: lock still there (%d, %v)", i+1, n, err)
		}
	}
}

// A release retried after its reply was lost still counts as done when,
// meanwhile, the next holder took the key and released it too: each node
// remembers recent releases by their owner tokens, not only the last one.
// (With one record per key, the next holder's release overwrote it, and the
// retried release, finding neither its lock nor its record, reported
// locker.ErrLost for a lock it had released on every node.)
func TestReleaseRetriedAfterNextHolderReleased(t *testing.T) {
	addrs := nodeAddrs(t, 3)
	adm := admins(t, addrs)
	var cs []goredis.UniversalClient
	var pxs []*testserver.Proxy
	for _, a := range addrs {
		px := testserver.NewProxy(t, a)
		pxs = append(pxs, px)
		c := goredis.NewClient(&goredis.Options{
			Addr:                  px.Addr(),
			ContextTimeoutEnabled: true,
			DialTimeout:           2 * time.Second,
			MinRetryBackoff:       400 * time.Millisecond,
			MaxRetryBackoff:       500 * time.Millisecond,
		})
		t.Cleanup(func() { _ = c.Close() })
		cs = append(cs, c)
	}
	l := redlock.New(cs, redlock.WithDefaultTTL(30*time.Second))
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	next := newLocker(t, addrs).l
	ctx := testCtx(t, 30*time.Second)
	key := uniqueKey(t)
	for _, w := range []*redlock.Locker{l, next} {
		warm, err := w.Acquire(ctx, key+"/warm-up")
		if err != nil {
			t.Fatal(err)
		}
		if err := warm.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	h, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	lock, _, _ := l.KeyNames(key)

	pxs[0].Latency(t, 20*time.Second)
	pxs[1].Latency(t, 20*time.Second)
	res := make(chan error, 1)
	go func() { res <- h.Release(ctx) }()
	for _, a := range adm {
		for {
			n, err := a.Exists(ctx, lock).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			time.Sleep(2 * time.Millisecond) // polling the server's state: no signal to wait on
		}
	}
	// The next holder comes and goes before the first release's retries.
	h2, err := next.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("next holder: %v", err)
	}
	if err := h2.Release(ctx); err != nil {
		t.Fatalf("next holder's release: %v", err)
	}
	pxs[0].ResetAll(t)
	pxs[1].ResetAll(t)
	pxs[0].Heal(t)
	pxs[1].Heal(t)
	if err := <-res; err != nil {
		t.Fatalf("Release whose replies were lost and retried after the next holder released: %v", err)
	}
	if h2.Token() <= h.Token() {
		t.Errorf("tokens: first %d, next %d", h.Token(), h2.Token())
	}
}
