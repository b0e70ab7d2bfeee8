package redlock_test

import (
	"context"
	"errors"
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
	if !errors.Is(err, locker.ErrUnsafeConfig) {
		t.Fatalf("TryAcquire over one server under two names: %v, want an error wrapping locker.ErrUnsafeConfig", err)
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
			l := redlock.New(cs, redlock.WithDefaultTTL(2*time.Second))
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

// A name of a server that was down at first contact is compared with the
// other nodes when it first answers: node 2, a proxy to node 1's server,
// blackholed while the Locker first reaches its nodes, must not make a
// majority with node 1 once it heals (on ce815f6 the second TryAcquire got
// the lock from one live server of three).
func TestAliasFirstSeenLater(t *testing.T) {
	live := nodeAddrs(t, 1)[0]
	px := testserver.NewProxy(t, live)
	px.Blackhole(t)
	addrs := []string{live, px.Addr(), deadAddr(t)}
	var cs []goredis.UniversalClient
	for _, a := range addrs {
		cs = append(cs, newClient(t, a))
	}
	l := redlock.New(cs, redlock.WithDefaultTTL(2*time.Second))
	t.Cleanup(func() { _ = l.Close() })
	ctx := testCtx(t, 30*time.Second)
	key := uniqueKey(t)
	if h, err := l.TryAcquire(ctx, key); err == nil {
		t.Fatalf("TryAcquire with one node of three answering: got a lock (token %d)", h.Token())
	}
	px.Heal(t)
	refusedAlias(t, l, live, px.Addr())
	// The refusal is for good: the node list is wrong.
	if _, err := l.TryAcquire(ctx, key); err == nil || !strings.Contains(err.Error(), px.Addr()) {
		t.Errorf("TryAcquire after the refusal: %v, want the same refusal", err)
	}
}

// A run_id changes when the server restarts, so the identity a node gave
// before the restart is not compared with one another name of the server
// gives after it: node 2, a proxy to node 1's server that was down until the
// server restarted, reports the new run_id while node 1's is the old one.
// Node 2 must not count until both are asked again together, which finds
// them one server: the round that first hears node 2 asks node 1 as well.
func TestAliasFirstSeenAfterRestart(t *testing.T) {
	srv := testserver.NewRedis(t)
	if !srv.CanControl() {
		t.Skip("the Redis server is not ours to restart")
	}
	px := testserver.NewProxy(t, srv.Addr())
	px.Blackhole(t)
	addrs := []string{srv.Addr(), px.Addr(), deadAddr(t)}
	var cs []goredis.UniversalClient
	for _, a := range addrs {
		cs = append(cs, newClient(t, a))
	}
	l := redlock.New(cs, redlock.WithDefaultTTL(2*time.Second))
	t.Cleanup(func() { _ = l.Close() })
	ctx := testCtx(t, 60*time.Second)
	key := uniqueKey(t)
	if h, err := l.TryAcquire(ctx, key); err == nil {
		t.Fatalf("TryAcquire with one node of three answering: got a lock (token %d)", h.Token())
	}
	srv.Stop(t)
	srv.Start(t)
	px.Heal(t)
	// Node 1 answered less than a minute ago; node 2 answers for the
	// first time, with the new run_id, so the round asks node 1 again.
	h, err := l.TryAcquire(ctx, key)
	if err == nil {
		defer h.Release(ctx)
		t.Fatalf("TryAcquire right after the restart: got a lock (token %d) from one server under two names", h.Token())
	}
	t.Logf("first round after the restart: %v", err)
	refusedAlias2(t, l, srv.Addr(), px.Addr(), key)
}

// refusedAlias2 is refusedAlias for a Locker over any server.
func refusedAlias2(t *testing.T, l locker.Locker, a1, a2, key string) {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	h, err := l.TryAcquire(ctx, key)
	if err == nil {
		defer h.Release(ctx)
		t.Fatalf("TryAcquire over nodes %s and %s (one server): got a lock (token %d)", a1, a2, h.Token())
	}
	if !errors.Is(err, locker.ErrUnsafeConfig) {
		t.Fatalf("TryAcquire over one server under two names: %v, want an error wrapping locker.ErrUnsafeConfig", err)
	}
	if !strings.Contains(err.Error(), a1) || !strings.Contains(err.Error(), a2) {
		t.Fatalf("TryAcquire over one server under two names: %v; want a refusal naming %s and %s", err, a1, a2)
	}
	t.Logf("refused: %v", err)
}
