package observe

import (
	"context"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/observe"
	"github.com/go-locker/locker/redis"
)

// BenchmarkOverhead measures what observe.Wrap costs on an uncontended
// Acquire+Release on Redis: the shared Uncontended case
// (conformance/benchmark), one cycle of each side in turn per iteration,
// which side goes first alternating, so that both see the same machine
// load. Two pairs, each run on its own: BenchmarkOverhead/sdk, "observed"
// a Redis Locker wrapped and recording through the OpenTelemetry SDK as a
// service would (every metric; every span sampled and exported by the
// SDK's batching processor, to a no-op exporter), against "bare", the
// Redis Locker alone; BenchmarkOverhead/sdk-metrics, the SDK's metrics
// and no spans (a no-op tracer provider); BenchmarkOverhead/noop, "observed" wrapped over the
// API's no-op providers (the globals before a program installs an SDK).
// Each side has a client of its own. The figure to read is observed/bare:
// the p50 of a cycle over the bare one's.
//
//	cd integration && go test -run '^$' -bench '^BenchmarkOverhead$' -benchtime 20000x -count 3 ./observe
func BenchmarkOverhead(b *testing.B) {
	addr := testserver.Redis(b).Addr()
	side := func(name string, wrap func(locker.Locker) locker.Locker) benchmark.Side {
		c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
		b.Cleanup(func() { _ = c.Close() })
		return benchmark.LockerSide(name, 1, func(testing.TB) locker.Locker { return wrap(redis.New(c)) })
	}
	for _, c := range []struct {
		name string
		opts func(b *testing.B) []observe.Option
	}{
		{"sdk", batched},
		{"sdk-metrics", func(*testing.B) []observe.Option {
			return []observe.Option{observe.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))),
				observe.WithTracerProvider(tracenoop.NewTracerProvider())}
		}},
		{"noop", func(*testing.B) []observe.Option { return nil }},
	} {
		b.Run(c.name, func(b *testing.B) {
			benchmark.Run(b, benchmark.Harness{
				Waiters: []int{}, Clients: -1, // Uncontended only
				Sides: []benchmark.Side{
					side("observed", func(l locker.Locker) locker.Locker { return observe.Wrap(l, c.opts(b)...) }),
					side("bare", func(l locker.Locker) locker.Locker { return l }),
				},
			})
		})
	}
}

// batched returns the options that record through an SDK meter provider (a
// ManualReader) and tracer provider that samples every span and exports
// them in batches (the SDK's batching span processor), to a no-op
// exporter.
func batched(b *testing.B) []observe.Option {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return []observe.Option{observe.WithMeterProvider(mp), observe.WithTracerProvider(tp), observe.WithKeys(observe.KeyHash)}
}
