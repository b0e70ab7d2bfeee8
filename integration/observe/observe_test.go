// Package observe runs the conformance suite on a Redis Locker wrapped by
// observe.Wrap, with the OpenTelemetry SDK recording, and measures what
// the wrapper costs on an uncontended lock.
package observe

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/observe"
	"github.com/go-locker/locker/redis"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// testClient returns a client of addr closed at the end of the test.
func testClient(t testing.TB, addr string) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		// A blackholed proxy must not keep a test waiting for long.
		DialTimeout: 2 * time.Second,
		ReadTimeout: 2 * time.Second,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// sdk returns the options that record through an SDK meter provider (a
// ManualReader) and tracer provider (every span sampled, exported to a
// no-op exporter): the wrapper's whole recording path runs.
func sdk() []observe.Option {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewNoopExporter()))
	return []observe.Option{observe.WithMeterProvider(mp), observe.WithTracerProvider(tp), observe.WithKeys(observe.KeyHash)}
}

// TestConformance runs the shared suite on redis.New wrapped by
// observe.Wrap: the harness of integration/redis's TestConformance (its
// ContextTimeout flavour), each Locker wrapped.
func TestConformance(t *testing.T) {
	srv := testserver.Redis(t)
	admin := testClient(t, srv.Addr())
	namer := redis.New(admin) // only for KeyNames: the default prefix, as the harness's Lockers
	opts := sdk()
	var proxies testserver.Registry[*testserver.Proxy]
	conformance.Run(t, conformance.Harness{
		IgnoreGoroutines: testserver.ProxyGoroutines,
		NewLocker: func(t *testing.T) locker.Locker {
			px := testserver.NewProxy(t, srv.Addr())
			l := observe.Wrap(redis.New(testClient(t, px.Addr())), opts...)
			t.Cleanup(func() { _ = l.Close() }) // before the client closes
			proxies.Put(l, px)
			return l
		},
		Crash: func(t *testing.T, l locker.Locker) { proxies.Get(t, l, "Crash").Crash(t) },
		Reset: func(t *testing.T, l locker.Locker) { proxies.Get(t, l, "Reset").ResetAll(t) },
		Cut: func(t *testing.T, l locker.Locker) func() {
			px := proxies.Get(t, l, "Cut")
			px.Blackhole(t)
			return func() { px.Heal(t) }
		},
		Steal: func(t *testing.T, h locker.Handle) {
			lock, _, _ := namer.KeyNames(h.Key())
			if err := admin.Del(context.Background(), lock).Err(); err != nil {
				t.Fatalf("Steal: DEL %s: %v", lock, err)
			}
		},
		URL: "redis://" + srv.Addr() + "/0",
		NewLockerWithTokenBase: func(t *testing.T, n int64) (locker.Locker, error) {
			l := observe.Wrap(redis.New(testClient(t, srv.Addr()), redis.WithTokenBase(n)), opts...)
			t.Cleanup(func() { _ = l.Close() })
			return l, nil
		},
		TTL:            2 * time.Second,
		NoInspectLease: "a Redis lock key keeps its remaining expiry (PTTL), not the lease it was set with",
	})
}
