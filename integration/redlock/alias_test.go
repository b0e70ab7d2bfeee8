package redlock_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis/redlock"
)

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// aliasCases are node lists naming one live server twice under different
// addresses, with a third node that is down: one server must never make a
// majority of three.
func aliasCases(t *testing.T) map[string][]string {
	live := nodeAddrs(t, 1)[0]
	_, port, _ := net.SplitHostPort(live)
	px := testserver.NewProxy(t, live) // a second path to the same server
	return map[string][]string{
		"localhost":  {live, net.JoinHostPort("localhost", port), deadAddr(t)},
		"TwoProxies": {px.Addr(), live, deadAddr(t)},
	}
}

// refusedAlias checks that l refuses key because two of its nodes are one
// server, naming both addresses, and leaves no lock on the server.
func refusedAlias(t *testing.T, l locker.Locker, a1, a2 string) {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	key := uniqueKey(t)
	h, err := l.TryAcquire(ctx, key)
	if err == nil {
		defer h.Release(ctx)
		t.Fatalf("TryAcquire over nodes %s and %s (one server) and a dead node: got a lock (token %d); one server must not make a majority of three", a1, a2, h.Token())
	}
	if !strings.Contains(err.Error(), a1) || !strings.Contains(err.Error(), a2) {
		t.Fatalf("TryAcquire over one server under two names: %v; want a refusal naming %s and %s", err, a1, a2)
	}
	t.Logf("refused: %v", err)
	lock, _, _ := namer.KeyNames(key)
	adm := admins(t, nodeAddrs(t, 1))[0]
	if n, err := adm.Exists(context.Background(), lock).Result(); err != nil || n != 0 {
		t.Errorf("lock key left on the server after the refusal: EXISTS = %d, %v", n, err)
	}
}

// TestAliasedNodesRefused: one server under two names (127.0.0.1:P and
// localhost:P, or the server and a proxy to it) is one node, whatever the
// address strings say, both for clients the caller made (New) and for a
// URL (Open).
func TestAliasedNodesRefused(t *testing.T) {
	for name, addrs := range aliasCases(t) {
		t.Run(name+"/New", func(t *testing.T) {
			var cs []goredis.UniversalClient
			for _, a := range addrs {
				cs = append(cs, newClient(t, a))
			}
			l := redlock.New(cs, redlock.WithTTL(2*time.Second))
			t.Cleanup(func() { _ = l.Close() })
			if err := l.Err(); err != nil {
				t.Fatalf("New: %v (New does not contact the nodes; the refusal comes at first contact)", err)
			}
			refusedAlias(t, l, addrs[0], addrs[1])
		})
		t.Run(name+"/Open", func(t *testing.T) {
			l, err := locker.Open(context.Background(), "redlock://"+strings.Join(addrs, ",")+"?ttl=2s&dial_timeout=1s")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			refusedAlias(t, l, addrs[0], addrs[1])
		})
	}
}
