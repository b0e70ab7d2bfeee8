// Package zookeeper_test runs the zookeeper backend against real ZooKeeper
// servers: the conformance suite, fault tests (session expiry, short and
// long partitions, nodes deleted from outside, ghost nodes, server
// restarts, ACLs, the herd check) and benchmarks against go-zookeeper's
// zk.Lock. It uses only the public API, as a third party's tests would.
package zookeeper_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/zookeeper"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// sessionTimeout is what the test Lockers ask for; the test servers run
// with tickTime=500ms, so they grant it as asked (it lies between 2 and 20
// ticks).
const sessionTimeout = 3 * time.Second

// client is a Locker on its own proxy to a server.
type client struct {
	l  *zookeeper.Locker
	px *testserver.Proxy
}

// newClient connects a Locker to srv through a proxy of its own.
func newClient(t testing.TB, addr string, opts ...zookeeper.Option) client {
	t.Helper()
	px := testserver.NewProxy(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts = append([]zookeeper.Option{zookeeper.WithDefaultTTL(sessionTimeout)}, opts...)
	l, err := zookeeper.Connect(ctx, []string{px.Addr()}, opts...)
	if err != nil {
		t.Fatalf("zookeeper.Connect: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return client{l, px}
}

// adminConn is a plain go-zookeeper connection to addr, for looking at and
// tampering with the tree from outside.
func adminConn(t testing.TB, addr string) *zk.Conn {
	t.Helper()
	c, events, err := zk.Connect([]string{addr}, 10*time.Second, zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatalf("zk.Connect: %v", err)
	}
	t.Cleanup(c.Close)
	deadline := time.After(30 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.State == zk.StateHasSession {
				return c
			}
		case <-deadline:
			t.Fatalf("no session with %s", addr)
		}
	}
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}

// registry maps the Lockers the harness made to their proxies.

// plainConn is a go-zookeeper connection to addr and its events channel,
// for New; it is closed when the test ends (after the Lockers on it, whose
// cleanups come later and so run first).
func plainConn(t testing.TB, addr string) (*zk.Conn, <-chan zk.Event) {
	t.Helper()
	c, events, err := zk.Connect([]string{addr}, sessionTimeout, zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatalf("zk.Connect: %v", err)
	}
	t.Cleanup(c.Close)
	return c, events
}
