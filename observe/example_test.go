package observe_test

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/go-locker/locker/memlock"
	"github.com/go-locker/locker/observe"
)

// ExampleWrap wraps a Locker and reads its metrics through the SDK's
// in-memory reader; a program would give the MeterProvider a Prometheus or
// OTLP exporter instead.
func ExampleWrap() {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	l := observe.Wrap(memlock.NewStore().NewLocker(), observe.WithMeterProvider(mp))

	h, err := l.Acquire(ctx, "payment/42")
	if err != nil {
		panic(err)
	}
	if _, err := l.TryAcquire(ctx, "payment/42"); err != nil {
		fmt.Println("second try:", err)
	}
	_ = h.Release(ctx)
	_ = l.Close() // returns once every lock's end is recorded

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		switch d := m.Data.(type) {
		case metricdata.Histogram[float64]:
			for _, p := range d.DataPoints {
				fmt.Printf("%s (%s)%s: count %d\n", m.Name, m.Unit, labels(p.Attributes), p.Count)
			}
		case metricdata.Sum[int64]:
			for _, p := range d.DataPoints {
				fmt.Printf("%s (%s)%s: %d\n", m.Name, m.Unit, labels(p.Attributes), p.Value)
			}
		}
	}
	// Unordered output:
	// second try: try-acquire "payment/42": locker: not acquired
	// locker.acquire.duration (s) operation=acquire outcome=acquired: count 1
	// locker.acquire.duration (s) operation=try_acquire outcome=not_acquired: count 1
	// locker.hold.duration (s) end=released: count 1
	// locker.releases ({release}) outcome=released: 1
	// locker.held ({lock}): 0
	// locker.waiting ({call}): 0
}

// labels are a data point's attributes less locker.backend and
// locker.family (memlock, mutex here), without the "locker." prefix.
func labels(s attribute.Set) string {
	var b strings.Builder
	for _, kv := range s.ToSlice() {
		if kv.Key != "locker.backend" && kv.Key != "locker.family" {
			fmt.Fprintf(&b, " %s=%s", strings.TrimPrefix(string(kv.Key), "locker."), kv.Value.String())
		}
	}
	return b.String()
}
