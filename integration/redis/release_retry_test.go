package redis_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis"
)

// TestReleaseRetriedAfterNextHolderReleased: a release that reached the
// server, but whose reply was lost, and that is sent again after the next
// holder took the key and released it too, still reports success: the
// server remembers the key's recent releases by their owner tokens, not
// only the last one. (With one record per key, the next holder's release
// overwrote it, and the retried release, finding neither its lock nor its
// record, reported locker.ErrLost for a lock it had released.)
func TestReleaseRetriedAfterNextHolderReleased(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	admin := testClient(t, srv.Addr(), true)
	px := testserver.NewProxy(t, srv.Addr())
	c := goredis.NewClient(&goredis.Options{
		Addr:                  px.Addr(),
		ContextTimeoutEnabled: true,
		DialTimeout:           2 * time.Second,
		// The reply is held until the test heals the proxy, which closes
		// the connection that carried it: go-redis then sends the request
		// again, on a new connection.
		ReadTimeout: 40 * time.Second,
	})
	t.Cleanup(func() { _ = c.Close() })
	l := redis.New(c, redis.WithDefaultTTL(30*time.Second))
	t.Cleanup(func() { _ = l.Close() })
	next := newTestLocker(t, srv.Addr())
	key := uniqueKey(t)

	// Load the scripts first (a first EVALSHA is answered NOSCRIPT, and
	// go-redis then sends the script itself).
	mustRelease(t, ctx, mustGet(t, ctx, l, key+"/warm-up"))
	h := mustGet(t, ctx, l, key)
	lock, _, _ := l.KeyNames(key)

	// The release reaches the server, and its reply (and that of every
	// attempt sent again meanwhile) is held back.
	px.BlackholeDownstream(t)
	res := make(chan error, 1)
	go func() { res <- h.Release(ctx) }()
	for {
		n, err := admin.Exists(ctx, lock).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		time.Sleep(2 * time.Millisecond) // polling the server's state: no signal to wait on
	}
	// The next holder comes and goes before the first release's reply is
	// heard.
	h2, err := next.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("next holder: %v", err)
	}
	if err := h2.Release(ctx); err != nil {
		t.Fatalf("next holder's release: %v", err)
	}
	select {
	case err := <-res:
		t.Fatalf("Release returned %v while no reply could reach it", err)
	default:
	}
	// The held connections close; go-redis sends the release again on a
	// new one, which passes.
	px.Heal(t)
	if err := <-res; err != nil {
		t.Fatalf("Release whose reply was lost, retried after the next holder released: %v, want nil (the first attempt released the lock)", err)
	}
	if err := h.Err(); !errors.Is(err, locker.ErrReleased) || errors.Is(err, locker.ErrLost) {
		t.Errorf("Err() after the retried release = %v, want ErrReleased", err)
	}
	if h2.Token() <= h.Token() {
		t.Errorf("tokens: first %d, next %d", h.Token(), h2.Token())
	}
}

// TestReleaseRecordsExpire: every release of a key is recorded, however
// many came after it (the record of a retried release must not be lost to
// the holders that came and went before the retry), each in a key of its own
// that expires within 15 seconds; nothing else of the key's is left once
// the records expire but its fence counter.
func TestReleaseRecordsExpire(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	admin := testClient(t, srv.Addr(), true)
	l := newTestLocker(t, srv.Addr())
	key := uniqueKey(t)
	lock, fence, _ := l.KeyNames(key)
	prefix := strings.TrimSuffix(lock, ":lock") + ":released-by:"
	var owners []string
	for range 40 {
		h := mustGet(t, ctx, l, key)
		mustRelease(t, ctx, h)
		owners = append(owners, h.Owner())
	}
	for i, o := range owners {
		pttl, err := admin.PTTL(ctx, prefix+o).Result()
		if err != nil || pttl <= 0 || pttl > 15*time.Second {
			t.Errorf("record of release %d (%s): PTTL = %v, %v; want in (0, 15s]", i, prefix+o, pttl, err)
		}
	}
	tag := strings.TrimSuffix(lock, "lock")
	names, err := admin.Keys(ctx, strings.NewReplacer("{", `\{`, "}", `\}`).Replace(tag)+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	want := []string{fence}
	for _, o := range owners {
		want = append(want, prefix+o)
	}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("the key's names after 40 releases: %v, want its fence counter and the 40 records %v", names, want)
	}
}
