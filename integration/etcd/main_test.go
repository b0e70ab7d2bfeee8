// Package etcd_test runs the etcd backend against real etcd servers: the
// conformance suite, fault tests (lease expiry while holding and while
// waiting, keys deleted from outside, compaction during a wait, stale
// releases, server restarts, etcd down during Close) and benchmarks
// against etcd's own concurrency.Mutex. It uses only the public API, as a
// third party's tests would.
package etcd_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/go-locker/locker/etcd"
	"github.com/go-locker/locker/integration/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// ttl is the lease the fault tests ask for: etcd's default minimum.
const ttl = 2 * time.Second

// client is a Locker on its own etcd client, dialing through its own proxy.
type client struct {
	l   *etcd.Locker
	cli *clientv3.Client
	px  *testserver.Proxy
}

// newEtcdClient dials addrs with settings fit for fault tests: no log
// noise, short dial timeout.
func newEtcdClient(t testing.TB, addrs ...string) *clientv3.Client {
	t.Helper()
	eps := make([]string, len(addrs))
	for i, a := range addrs {
		eps[i] = "http://" + a
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:            eps,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    time.Second,
		DialKeepAliveTimeout: time.Second,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("clientv3.New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newClient makes a Locker on a client of its own that dials addr through
// a proxy of its own.
func newClient(t testing.TB, addr string, opts ...etcd.Option) client {
	t.Helper()
	px := testserver.NewProxy(t, addr)
	c := newEtcdClient(t, px.Addr())
	l := etcd.New(c, opts...)
	t.Cleanup(func() { _ = l.Close() })
	return client{l, c, px}
}

// registry maps the Lockers the harness made to their proxies.
func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
