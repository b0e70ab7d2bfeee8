// Package redlock_test runs the Redlock backend against real, independent
// Redis servers: the conformance suite on 3 and 5 nodes, fault tests (a
// minority of nodes down or cut off, a majority down, lock keys that vanish
// early on one node, a node that lost its counters) and benchmarks against
// the single-node backend and go-redsync/redsync. It uses only the public
// API, as a third party's tests would.
package redlock_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis/redlock"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// maxNodes is how many servers the binary starts; tests on 3 nodes use the
// first 3.
const maxNodes = 5

var (
	nodesOnce  sync.Once
	nodesAddrs []string
	// nodesPublished: this process set LOCKER_TEST_REDIS_NODES itself
	// (for its child processes), so the nodes it names are ours to
	// control, not the environment's.
	nodesPublished bool
)

// nodeAddrs returns the addresses of n independent Redis servers. The
// binary starts maxNodes of them once, and publishes their addresses in
// LOCKER_TEST_REDIS_NODES so that the child processes of the conformance
// suite's Process cases lock on the same servers.
func nodeAddrs(t testing.TB, n int) []string {
	t.Helper()
	nodesOnce.Do(func() {
		for _, s := range testserver.RedisNodes(t, maxNodes) {
			nodesAddrs = append(nodesAddrs, s.Addr())
		}
		if os.Getenv(testserver.EnvRedisNodes) == "" {
			_ = os.Setenv(testserver.EnvRedisNodes, strings.Join(nodesAddrs, ","))
			nodesPublished = true
		}
	})
	if len(nodesAddrs) < n {
		t.Fatalf("have %d Redis nodes, need %d", len(nodesAddrs), n)
	}
	return nodesAddrs[:n]
}

// newClient returns a client of addr closed at the end of the test.
func newClient(t testing.TB, addr string) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		DialTimeout:           2 * time.Second,
		ReadTimeout:           2 * time.Second,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// admins returns a direct client per node, for inspecting and tampering.
func admins(t testing.TB, addrs []string) []*goredis.Client {
	out := make([]*goredis.Client, len(addrs))
	for i, a := range addrs {
		out[i] = newClient(t, a)
	}
	return out
}

// client is a Locker whose path to each node goes through a proxy of its
// own, so that a test can crash, cut or slow its link to any node.
type client struct {
	l   *redlock.Locker
	pxs []*testserver.Proxy
}

func newLocker(t testing.TB, addrs []string, opts ...redlock.Option) client {
	t.Helper()
	var cs []goredis.UniversalClient
	var pxs []*testserver.Proxy
	for _, a := range addrs {
		px := testserver.NewProxy(t, a)
		pxs = append(pxs, px)
		cs = append(cs, newClient(t, px.Addr()))
	}
	l := redlock.New(cs, opts...)
	if err := l.Err(); err != nil {
		t.Fatalf("redlock.New: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() }) // before the clients close
	return client{l, pxs}
}

// sharedPaths makes Lockers that share one proxy per node, so that a test
// can take a node down for all of them at once.
type sharedPaths struct {
	addrs []string
	pxs   []*testserver.Proxy
}

func newSharedPaths(t testing.TB, addrs []string) *sharedPaths {
	s := &sharedPaths{addrs: addrs}
	for _, a := range addrs {
		s.pxs = append(s.pxs, testserver.NewProxy(t, a))
	}
	return s
}

func (s *sharedPaths) locker(t testing.TB, opts ...redlock.Option) *redlock.Locker {
	t.Helper()
	var cs []goredis.UniversalClient
	for _, px := range s.pxs {
		cs = append(cs, newClient(t, px.Addr()))
	}
	l := redlock.New(cs, opts...)
	if err := l.Err(); err != nil {
		t.Fatalf("redlock.New: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// uniqueKey is a key no other test uses.
func uniqueKey(t testing.TB) string {
	return "redlock-test/" + t.Name() + "/" + time.Now().Format(time.RFC3339Nano)
}

var _ locker.Locker = (*redlock.Locker)(nil)
