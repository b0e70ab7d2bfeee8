package redis

import (
	"context"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/internal/testserver"
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
	for _, tc := range []struct {
		name     string
		ctxAware bool
		opts     []Option
	}{
		{"ContextTimeout", true, nil},
		{"DefaultClient", false, nil},
		{"ClockTokens", true, []Option{WithClockTokens(true)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if testing.Short() && tc.name != "ContextTimeout" {
				t.Skip("-short: one flavour is enough")
			}
			var (
				mu      sync.Mutex
				proxies = map[locker.Locker]*testserver.Proxy{}
			)
			conformance.Run(t, conformance.Harness{
				// Each Locker is another process: its own client, and its own
				// connection path through a fault proxy so Cut can sever it.
				NewLocker: func(t *testing.T) locker.Locker {
					px := testserver.NewProxy(t, srv.Addr())
					l := New(testClient(t, px.Addr(), tc.ctxAware), tc.opts...)
					t.Cleanup(func() { _ = l.Close() }) // before the client closes
					mu.Lock()
					proxies[l] = px
					mu.Unlock()
					return l
				},
				Crash: crashLocker,
				Cut: func(t *testing.T, l locker.Locker) func() {
					mu.Lock()
					px := proxies[l]
					mu.Unlock()
					px.Blackhole(t)
					return func() { px.Heal(t) }
				},
				TTL:    2 * time.Second,
				MinTTL: MinTTL,
			})
		})
	}
}

// newTestLocker returns a Locker on its own client of addr, closed at the end
// of the test.
func newTestLocker(t testing.TB, addr string, opts ...Option) *Locker {
	t.Helper()
	l := New(testClient(t, addr, true), opts...)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func uniqueKey(t testing.TB) string {
	return "test/" + t.Name() + "/" + newOwner()
}

func mustGet(t testing.TB, ctx context.Context, l *Locker, key string, opts ...locker.Option) *Handle {
	t.Helper()
	h, err := l.Acquire(ctx, key, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", key, err)
	}
	return h.(*Handle)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// crashLocker is the harnesses' Crash: a killed process. Renewal and Pub/Sub
// stop, nothing is released, and the client never speaks again.
func crashLocker(t *testing.T, l locker.Locker) {
	rl := l.(*Locker)
	rl.crash()
	_ = rl.client.Close()
}
