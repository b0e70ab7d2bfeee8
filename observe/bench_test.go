package observe_test

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/memlock"
	"github.com/go-locker/locker/observe"
)

// BenchmarkCycle is an uncontended Acquire+Release on memlock, bare and
// wrapped (no-op providers; the SDK recording): memlock takes no round
// trip, so the difference is what the wrapper costs in CPU.
//
//	go test -run '^$' -bench '^BenchmarkCycle$' ./observe
func BenchmarkCycle(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewNoopExporter()))
	for _, c := range []struct {
		name string
		wrap func(locker.Locker) locker.Locker
	}{
		{"bare", func(l locker.Locker) locker.Locker { return l }},
		{"noop", func(l locker.Locker) locker.Locker { return observe.Wrap(l) }},
		{"sdk", func(l locker.Locker) locker.Locker {
			return observe.Wrap(l, observe.WithMeterProvider(mp), observe.WithTracerProvider(tp))
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			l := c.wrap(memlock.NewStore().NewLocker())
			defer l.Close()
			b.ReportAllocs()
			for b.Loop() {
				h, err := l.Acquire(ctx, "k")
				if err != nil {
					b.Fatal(err)
				}
				if err := h.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
