package observe

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/observe"
	"github.com/go-locker/locker/redis"
)

// TestAtRiskMetric: a Redis holder partitioned from its server is at risk
// through the wrapped Handle, and locker.at_risk counts it, until the
// partition heals and a renewal succeeds again.
func TestAtRiskMetric(t *testing.T) {
	srv := testserver.Redis(t)
	px := testserver.NewProxy(t, srv.Addr())
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	l := observe.Wrap(redis.New(testClient(t, px.Addr())), observe.WithMeterProvider(mp))
	t.Cleanup(func() { _ = l.Close() })
	ctx := context.Background()
	h, err := l.Acquire(ctx, "at-risk-metric", locker.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r, ok := h.(locker.AtRisker)
	if !ok {
		t.Fatalf("the wrapped redis Handle (%T) is not a locker.AtRisker", h)
	}
	px.Partition(t)
	waitRisk(t, h, r, true)
	waitGauge(t, reader, 1)
	px.Heal(t)
	waitRisk(t, h, r, false)
	waitGauge(t, reader, 0)
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func waitRisk(t *testing.T, h locker.Handle, r locker.AtRisker, want bool) {
	t.Helper()
	for {
		at, changed := r.AtRisk()
		if at == want {
			return
		}
		select {
		case <-changed:
		case <-h.Done():
			t.Fatalf("lock ended (%v) before AtRisk reported %t", h.Err(), want)
		}
	}
}

// waitGauge polls locker.at_risk until it is want: the wrapper's watcher
// follows the handle on a goroutine of its own and gives no signal.
func waitGauge(t *testing.T, reader *sdkmetric.ManualReader, want int64) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	var got int64
	for {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		got = 0
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "locker.at_risk" {
					if m.Unit != "{lock}" || s.IsMonotonic {
						t.Errorf("locker.at_risk: unit %q, monotonic %t; want {lock}, an up-down counter", m.Unit, s.IsMonotonic)
					}
					for _, p := range s.DataPoints {
						got += p.Value
					}
				}
			}
		}
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("locker.at_risk is %d, want %d", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
