// Package redis_test runs the redis backend against real Redis servers: the
// conformance suite, fault tests (crashed, cut-off, slowed and paused
// holders, restarted servers), Cluster, Sentinel, TLS and ACL tests, and the
// benchmarks. It uses only the public API of the locker packages, as a
// third-party backend's tests would; the unit tests that need no server stay
// in the redis package.
package redis_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// testClient returns a client of addr closed at the end of the test.
func testClient(t testing.TB, addr string, ctxAware bool) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: ctxAware,
		// A blackholed proxy must not keep a test waiting for long.
		DialTimeout: 2 * time.Second,
		ReadTimeout: 2 * time.Second,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestConformance runs the shared suite against a real Redis: with a client
// that honours contexts during socket I/O, with one that does not (the
// go-redis default), which takes the Locker's detached-call path, and with
// clock-floored tokens.
func TestConformance(t *testing.T) {
	srv := testserver.Redis(t)
	admin := testClient(t, srv.Addr(), true)
	namer := redis.New(admin) // only for KeyNames: the default prefix, as the harness's Lockers
	for _, tc := range []struct {
		name     string
		ctxAware bool
		opts     []redis.Option
	}{
		{"ContextTimeout", true, nil},
		{"DefaultClient", false, nil},
		{"ClockTokens", true, []redis.Option{redis.WithClockTokens(true)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if testing.Short() && tc.name != "ContextTimeout" {
				t.Skip("-short: one flavour is enough")
			}
			var proxies testserver.Registry[*testserver.Proxy]
			conformance.Run(t, conformance.Harness{
				IgnoreGoroutines: testserver.ProxyGoroutines,
				// Each Locker is another process: its own client, and its own
				// connection path through a fault proxy so that Cut can
				// sever it and Crash can kill it.
				NewLocker: func(t *testing.T) locker.Locker {
					px := testserver.NewProxy(t, srv.Addr())
					l := redis.New(testClient(t, px.Addr(), tc.ctxAware), tc.opts...)
					t.Cleanup(func() { _ = l.Close() }) // before the client closes
					proxies.Put(l, px)
					return l
				},
				// A killed process: its connections end and it never speaks
				// to the server again, so nothing is released or renewed and
				// its locks stay until their lease runs out.
				Crash: func(t *testing.T, l locker.Locker) { proxies.Get(t, l, "Crash").Crash(t) },
				// Every connection of the client closed from outside (CLIENT
				// KILL, a proxy, a restart of the connection); it reconnects.
				Reset: func(t *testing.T, l locker.Locker) { proxies.Get(t, l, "Reset").ResetAll(t) },
				Cut: func(t *testing.T, l locker.Locker) func() {
					px := proxies.Get(t, l, "Cut")
					px.Blackhole(t)
					return func() { px.Heal(t) }
				},
				// An eviction, a failover to a replica that missed the
				// write, or an operator: the lock key vanishes.
				Steal: func(t *testing.T, h locker.Handle) {
					lock, _, _ := namer.KeyNames(h.Key())
					if err := admin.Del(context.Background(), lock).Err(); err != nil {
						t.Fatalf("Steal: DEL %s: %v", lock, err)
					}
				},
				URL: "redis://" + srv.Addr() + "/0",
				// The flavour's options, which the URL does not carry
				// (WithClockTokens), with the token base.
				NewLockerWithTokenBase: func(t *testing.T, n int64) (locker.Locker, error) {
					l := redis.New(testClient(t, srv.Addr(), tc.ctxAware), append(slices.Clone(tc.opts), redis.WithTokenBase(n))...)
					t.Cleanup(func() { _ = l.Close() })
					return l, nil
				},
				TTL:            2 * time.Second,
				NoInspectLease: "a Redis lock key keeps its remaining expiry (PTTL), not the lease it was set with",
				Unsafe: []conformance.UnsafeConfig{{
					Name: "maxmemory-policy=allkeys-lru",
					New: func(t *testing.T) (locker.Locker, error) {
						ctx := context.Background()
						setPolicy(t, ctx, admin, "allkeys-lru")
						t.Cleanup(func() { setPolicy(t, ctx, admin, "noeviction") })
						l := redis.New(testClient(t, srv.Addr(), tc.ctxAware), tc.opts...)
						t.Cleanup(func() { _ = l.Close() })
						return l, nil
					},
					Mention: "maxmemory-policy",
				}},
			})
		})
	}
}

// newTestLocker returns a Locker on its own client of addr, closed at the end
// of the test.
func newTestLocker(t testing.TB, addr string, opts ...redis.Option) *redis.Locker {
	t.Helper()
	l := redis.New(testClient(t, addr, true), opts...)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// randomID returns 128 random bits in base64url.
func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func uniqueKey(t testing.TB) string {
	return "test/" + t.Name() + "/" + randomID()
}

func mustGet(t testing.TB, ctx context.Context, l *redis.Locker, key string, opts ...locker.Option) *redis.Handle {
	t.Helper()
	h, err := l.Acquire(ctx, key, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", key, err)
	}
	return h.(*redis.Handle)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitSubscribed waits until channel (a key's wake-up channel, see
// Locker.KeyNames) has a subscriber on the server admin talks to, as the
// server reports it (PUBSUB NUMSUB): a waiter is then listening for the
// release. It fails t at ctx's end.
func waitSubscribed(t testing.TB, ctx context.Context, admin *goredis.Client, channel string) {
	t.Helper()
	for {
		counts, err := admin.PubSubNumSub(ctx, channel).Result()
		if err == nil && counts[channel] >= 1 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no subscriber on %q: PUBSUB NUMSUB = %v, %v", channel, counts, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// pubSubClients returns the ids of the connections named name on the server
// admin talks to that are subscribed to at least one channel (CLIENT LIST).
func pubSubClients(t testing.TB, ctx context.Context, admin *goredis.Client, name string) map[string]bool {
	t.Helper()
	list, err := admin.ClientList(ctx).Result()
	if err != nil {
		t.Fatalf("CLIENT LIST: %v", err)
	}
	ids := map[string]bool{}
	for _, line := range strings.Split(list, "\n") {
		f := map[string]string{}
		for _, kv := range strings.Fields(line) {
			k, v, _ := strings.Cut(kv, "=")
			f[k] = v
		}
		if f["name"] == name && f["sub"] != "" && f["sub"] != "0" {
			ids[f["id"]] = true
		}
	}
	return ids
}

// waitResubscribed waits until the connections named name that were
// subscribed (old) are gone from the server and a new one named name is
// subscribed, with channel counted by PUBSUB NUMSUB. It fails t at ctx's
// end.
func waitResubscribed(t testing.TB, ctx context.Context, admin *goredis.Client, name string, old map[string]bool, channel string) {
	t.Helper()
	for {
		now := pubSubClients(t, ctx, admin, name)
		fresh, stale := 0, 0
		for id := range now {
			if old[id] {
				stale++
			} else {
				fresh++
			}
		}
		counts, err := admin.PubSubNumSub(ctx, channel).Result()
		if stale == 0 && fresh > 0 && err == nil && counts[channel] >= 1 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no resubscription of %q: old connections still there %d, new subscribed connections %d, PUBSUB NUMSUB = %v, %v", channel, stale, fresh, counts, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
