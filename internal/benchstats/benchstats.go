// Package benchstats reports latency distributions from benchmarks in one
// form, so that the backends' figures (and benchstat's comparisons of them)
// line up.
package benchstats

import (
	"slices"
	"testing"
	"time"
)

// ReportPercentiles sorts samples and reports their p50 and p99 in
// microseconds as the metrics "p50-µs" and "p99-µs". It reports nothing for
// no samples.
func ReportPercentiles(b *testing.B, samples []time.Duration) {
	if len(samples) == 0 {
		return
	}
	slices.Sort(samples)
	b.ReportMetric(Micros(Percentile(samples, 0.50)), "p50-µs")
	b.ReportMetric(Micros(Percentile(samples, 0.99)), "p99-µs")
}

// Percentile returns the p-th quantile (0 ≤ p ≤ 1) of sorted samples, by the
// nearest-rank method on index p×(n−1).
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(p*float64(len(sorted)-1))]
}

// Micros converts d to microseconds.
func Micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// Rotated runs one iteration, number i, of an interleaved benchmark: every
// side once, starting with side i mod len(sides), so that over the run each
// side goes first as often as the others. The first side of an iteration
// runs on a machine that was doing something else, and pays for it.
func Rotated(i int, sides ...func()) {
	for j := range sides {
		sides[(i+j)%len(sides)]()
	}
}
