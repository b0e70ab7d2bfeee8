package postgres

import (
	"context"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// testInterval is the health-check interval of the tests' Lockers: short, so
// that a cut-off holder hears of it within a second or two, and long enough
// that a check never times out on a loaded test machine.
const testInterval = 500 * time.Millisecond

// withHost returns dsn with its host:port replaced by addr and the query
// parameters in extra added.
func withHost(t testing.TB, dsn, addr string, extra url.Values) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("parse DSN: %v", err)
	}
	if addr != "" {
		u.Host = addr
	}
	q := u.Query()
	for k, vs := range extra {
		q[k] = vs
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// newPool returns a pool of at most maxConns connections to dsn, closed when
// the test ends (after the Lockers built on it, which register later).
func newPool(t testing.TB, dsn string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("pgxpool.ParseConfig: %v", err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgxpool.NewWithConfig: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// newLocker builds a Locker on pool, closed when the test ends.
func newLocker(t testing.TB, pool *pgxpool.Pool, opts ...Option) *Locker {
	t.Helper()
	opts = append([]Option{WithHealthCheckInterval(testInterval)}, opts...)
	l := New(pool, opts...)
	t.Cleanup(func() { l.Close() })
	return l
}

// crash makes l die as a killed process would: every pinned connection is
// closed under it, without an unlock. The server ends those sessions and so
// frees their locks; the health monitors see the dead sockets and stop.
func (l *Locker) crash() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for h := range l.handles {
		_ = h.pgc.Conn().Close()
	}
}

func TestConformance(t *testing.T) {
	srv := testserver.Postgres(t)
	var proxies sync.Map // *Locker → *testserver.Proxy
	conformance.Run(t, conformance.Harness{
		NewLocker: func(t *testing.T) locker.Locker {
			// Each client gets a proxy of its own, so that Cut can cut off
			// exactly that client, and a pool of its own (it is another
			// process). 30 connections cover ManyKeys plus waiters.
			px := testserver.NewProxy(t, srv.Addr())
			dsn := withHost(t, srv.DSN(), px.Addr(), url.Values{
				"pool_max_conns":       {"30"},
				"lock_health_interval": {testInterval.String()},
				"lock_namespace":       {"conformance"},
			})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			l, err := locker.Open(ctx, dsn)
			if err != nil {
				t.Fatalf("locker.Open: %v", err)
			}
			proxies.Store(l, px)
			t.Cleanup(func() { l.Close() })
			return l
		},
		// Crash closes the holder's connections without unlocking, as the
		// kernel does for a killed process.
		Crash: func(t *testing.T, l locker.Locker) { l.(*Locker).crash() },
		// Cut blackholes the client's proxy: its connections stay open but
		// nothing passes, as in a partition. The server keeps the session,
		// and the lock, until the holder's health check fails and the holder
		// closes its connection (which the proxy passes on). That is the
		// order the contract asks for: the holder hears of the loss before
		// anyone else can take the key. pg_terminate_backend would cut the
		// other way round — the server frees the lock first, and the holder
		// learns a moment later — which TestTerminatedBackend covers.
		Cut: func(t *testing.T, l locker.Locker) func() {
			v, ok := proxies.Load(l)
			if !ok {
				t.Fatalf("Cut: the Locker was not made by NewLocker")
			}
			px := v.(*testserver.Proxy)
			px.Blackhole(t)
			return func() { px.Heal(t) }
		},
		// Advisory locks have no lease; the TTL the suite asks for is
		// validated and ignored.
		NoTTL: true,
		TTL:   time.Second,
		// Crash frees the key at once; Cut within two health-check
		// intervals (a missed idle period, then a check that times out).
		ExpiryBound:  4 * testInterval * 2,
		HandoffBound: time.Second,
		ManyKeys:     20,
	})
}
