package redlock_test

import (
	"context"
	"strconv"
	"strings"
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

// slowLocker is a Locker on addrs through proxies that add 600ms to every
// reply, with clients made by newCl. Their connections are made before the
// link slows: a connection's handshake takes go-redis two or three round
// trips of its own, which the first request's dial allowance (1s) does not
// cover at 600ms each.
func slowLocker(t *testing.T, ctx context.Context, addrs []string, opts []redlock.Option, newCl func(addr string) *goredis.Client) *redlock.Locker {
	t.Helper()
	var cs []goredis.UniversalClient
	var pxs []*testserver.Proxy
	for _, a := range addrs {
		px := testserver.NewProxy(t, a)
		pxs = append(pxs, px)
		cl := newCl(px.Addr())
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
	return l
}

// The nodes' scripts on a link whose round trip is more than half the node
// timeout (600ms of 1s here; cross-region nodes with a tight node timeout):
// a request gets one round trip. A node that does not know a script
// answers NOSCRIPT, and running the script's text after it would be a
// second round trip, which the node timeout cuts; so a script's first use
// on a node, and its first after a NOSCRIPT, runs by its text:
//   - a fresh Locker on fresh servers acquires in its first call;
//   - so does a user whose ACL refuses SCRIPT (and allows EVAL);
//   - after the nodes lost their scripts (restart, SCRIPT FLUSH), the first
//     script that meets NOSCRIPT makes the Locker forget what the nodes
//     had, so that another script run after it takes one round trip.
func TestScriptsOnSlowLink(t *testing.T) {
	addrs := nodeAddrs(t, 3)
	ctx := testCtx(t, 60*time.Second)
	opts := []redlock.Option{redlock.WithDefaultTTL(30 * time.Second), redlock.WithNodeTimeout(time.Second)}

	t.Run("FirstContact", func(t *testing.T) {
		flushScripts(t, addrs)
		l := slowLocker(t, ctx, addrs, opts, func(addr string) *goredis.Client { return newClient(t, addr) })
		h, err := l.TryAcquire(ctx, uniqueKey(t))
		if err != nil {
			t.Fatalf("a fresh Locker's first TryAcquire on nodes without its scripts, 600ms away with a node timeout of 1s: %v", err)
		}
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("NoScriptCommand", func(t *testing.T) {
		// A user whose ACL refuses SCRIPT (as redis/doc.go's least
		// privilege does) and allows EVAL: each script's first use on a
		// node runs by its text, in one round trip.
		flushScripts(t, addrs)
		user := "noscript-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		for i, a := range admins(t, addrs) {
			if err := a.Do(ctx, "ACL", "SETUSER", user, "on", ">pw-noscript", "~*", "&*", "+@all", "-script").Err(); err != nil {
				t.Fatalf("node %d: ACL SETUSER: %v", i+1, err)
			}
			t.Cleanup(func() { a.Do(context.Background(), "ACL", "DELUSER", user) })
		}
		l := slowLocker(t, ctx, addrs, opts, func(addr string) *goredis.Client {
			cl := goredis.NewClient(&goredis.Options{Addr: addr, Username: user, Password: "pw-noscript",
				ContextTimeoutEnabled: true, DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second})
			t.Cleanup(func() { _ = cl.Close() })
			if err := cl.ScriptLoad(ctx, "return 1").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
				t.Fatalf("SCRIPT LOAD as %s: %v, want NOPERM", user, err)
			}
			return cl
		})
		key := uniqueKey(t)
		for i := range 2 {
			h, err := l.TryAcquire(ctx, key)
			if err != nil {
				t.Fatalf("TryAcquire %d of a user without SCRIPT, 600ms away with a node timeout of 1s: %v", i+1, err)
			}
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("AfterFlush", func(t *testing.T) {
		// The nodes lose their scripts; the next call, on a fast link,
		// meets NOSCRIPT, so that a script it did not
		// run (Inspect's) takes one round trip on the slow link after.
		c := newLocker(t, addrs, opts...)
		key := uniqueKey(t)
		warm(t, c.l, key)
		flushScripts(t, addrs)
		h, err := c.l.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("TryAcquire after SCRIPT FLUSH: %v", err)
		}
		for _, px := range c.pxs {
			px.Latency(t, 600*time.Millisecond)
		}
		info, err := c.l.Inspect(ctx, key)
		if err != nil {
			t.Fatalf("Inspect after SCRIPT FLUSH, 600ms away with a node timeout of 1s: %v", err)
		}
		if info.Token != h.Token() {
			t.Errorf("Inspect after SCRIPT FLUSH: token %d, want the holder's %d", info.Token, h.Token())
		}
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
