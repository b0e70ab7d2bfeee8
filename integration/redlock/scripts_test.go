package redlock_test

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis/redlock"
)

// flushScripts empties every node's script cache (SCRIPT FLUSH), as a
// server's restart or first start does.
func flushScripts(t *testing.T, addrs []string) {
	t.Helper()
	for i, a := range admins(t, addrs) {
		if err := a.ScriptFlush(context.Background()).Err(); err != nil {
			t.Fatalf("node %d: SCRIPT FLUSH: %v", i+1, err)
		}
	}
}

// The nodes' scripts on a link whose round trip is more than half the node
// timeout (600ms of 1s here; cross-region nodes with a tight node timeout):
// a request gets one round trip. A node that does not know a script
// answers NOSCRIPT, and running the script's text after it would be a
// second round trip, which the node timeout cuts; so the Locker must not
// meet a missing script more than once per node:
//   - a Locker's first contact with a node loads every script in its first
//     round's pipeline, so that a fresh Locker on fresh servers acquires in
//     its first call;
//   - after the nodes lost their scripts (restart, SCRIPT FLUSH), the first
//     call fails (the NOSCRIPT costs its round trip) and loads every script
//     on the way, so that the second call acquires: its grant and its
//     write-back run scripts the nodes have not run since.
func TestScriptsOnSlowLink(t *testing.T) {
	addrs := nodeAddrs(t, 3)
	ctx := testCtx(t, 60*time.Second)
	opts := []redlock.Option{redlock.WithDefaultTTL(30 * time.Second), redlock.WithNodeTimeout(time.Second)}

	t.Run("FirstContact", func(t *testing.T) {
		flushScripts(t, addrs)
		// The clients' connections are made before the link slows: a
		// connection's handshake takes go-redis two or three round trips
		// of its own, which the first request's dial allowance (1s) does
		// not cover at 600ms each.
		var cs []goredis.UniversalClient
		var pxs []*testserver.Proxy
		for _, a := range addrs {
			px := testserver.NewProxy(t, a)
			pxs = append(pxs, px)
			cl := newClient(t, px.Addr())
			if err := cl.Ping(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			cs = append(cs, cl)
		}
		l := redlock.New(cs, opts...)
		if err := l.Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		for _, px := range pxs {
			px.Latency(t, 600*time.Millisecond)
		}
		key := uniqueKey(t)
		h, err := l.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("a fresh Locker's first TryAcquire on nodes without its scripts, 600ms away with a node timeout of 1s: %v", err)
		}
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("AfterFlush", func(t *testing.T) {
		c := newLocker(t, addrs, opts...)
		key := uniqueKey(t)
		warm(t, c.l, key)
		flushScripts(t, addrs)
		for _, px := range c.pxs {
			px.Latency(t, 600*time.Millisecond)
		}
		if h, err := c.l.TryAcquire(ctx, key); err == nil {
			// Not wrong, but then this test no longer tests the path.
			t.Fatalf("the first TryAcquire after SCRIPT FLUSH, 600ms away with a node timeout of 1s, acquired (token %d): NOSCRIPT should have cost it its round trip", h.Token())
		} else {
			t.Logf("first TryAcquire after SCRIPT FLUSH: %v", err)
		}
		h, err := c.l.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("the second TryAcquire after SCRIPT FLUSH (the first should have loaded every script): %v", err)
		}
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
