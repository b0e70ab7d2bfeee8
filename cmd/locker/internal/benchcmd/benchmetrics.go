package benchcmd

import (
	"context"
	"encoding/json"
	"io"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/observe"
)

// benchMetrics records, for --metrics, the OpenTelemetry metrics of
// package observe (locker.acquire.duration, locker.releases, ...) of each
// case's Lockers: one MeterProvider per case, whose resource names the
// case (locker.bench.case) and the run (locker.bench.run), read by a
// ManualReader once the run is over. No exporter: the SDK's own data,
// encoded as JSON as stdoutmetric does, so that locker-full gains no
// package with work to do at init.
type benchMetrics struct {
	run   string
	cases []caseMetrics
}

type caseMetrics struct {
	name   string
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

// open opens url with its Locker wrapped by observe.Wrap, recording into
// the MeterProvider of the case name (the URL's scheme as locker.backend).
func (m *benchMetrics) open(ctx context.Context, name, url string) (locker.Locker, error) {
	var c *caseMetrics
	for i := range m.cases {
		if m.cases[i].name == name {
			c = &m.cases[i]
		}
	}
	if c == nil {
		r := sdkmetric.NewManualReader()
		res := resource.NewSchemaless(
			attribute.String("service.name", "locker bench"),
			attribute.String("locker.bench.run", m.run),
			attribute.String("locker.bench.case", name))
		m.cases = append(m.cases, caseMetrics{name: name, reader: r,
			mp: sdkmetric.NewMeterProvider(sdkmetric.WithReader(r), sdkmetric.WithResource(res))})
		c = &m.cases[len(m.cases)-1]
	}
	return observe.Open(ctx, url, observe.WithMeterProvider(c.mp))
}

// write collects every case's metrics, their Lockers closed, and writes
// them to w: a JSON array of one metricdata.ResourceMetrics per case, in
// the order the cases ran.
func (m *benchMetrics) write(ctx context.Context, w io.Writer) error {
	all := make([]*metricdata.ResourceMetrics, 0, len(m.cases))
	for _, c := range m.cases {
		rm := &metricdata.ResourceMetrics{}
		if err := c.reader.Collect(ctx, rm); err != nil {
			return err
		}
		all = append(all, rm)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(all)
}
