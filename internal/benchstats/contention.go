package benchstats

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Take takes a contended lock and returns its release.
type Take func(ctx context.Context) (release func(context.Context) error, err error)

// Contention is a group of competitors for one lock, one goroutine per
// Take (like separate processes when each Take has a client of its own),
// each holding the lock for Hold whenever it gets it. Run runs a phase; the
// totals add up over the phases run since the last Reset.
type Contention struct {
	Takes []Take
	Hold  time.Duration

	Counts   []int64 // acquisitions per competitor
	Acquired int64
	Elapsed  time.Duration
	// Handoffs are the times from the start of a release to the next
	// acquisition, by any competitor, the releaser included.
	Handoffs []time.Duration

	lastRelease atomic.Int64 // unix ns of the last release's start in this phase; 0 none yet
	mu          sync.Mutex   // guards Handoffs during a phase
}

// Run makes n acquisitions, all competitors competing, and adds them to the
// totals. It returns the first error of a Take or a release; the
// competitor that got it stops.
func (c *Contention) Run(ctx context.Context, n int64) error {
	if len(c.Counts) != len(c.Takes) {
		c.Counts = make([]int64, len(c.Takes))
	}
	var (
		left     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	fail := func(err error) { errOnce.Do(func() { firstErr = err }) }
	left.Store(n)
	c.lastRelease.Store(0)
	start := time.Now()
	for i, take := range c.Takes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				release, err := take(ctx)
				if err != nil {
					fail(err)
					return
				}
				if r := c.lastRelease.Load(); r != 0 {
					d := time.Since(time.Unix(0, r))
					c.mu.Lock()
					c.Handoffs = append(c.Handoffs, d)
					c.mu.Unlock()
				}
				time.Sleep(c.Hold)
				c.lastRelease.Store(time.Now().UnixNano())
				if err := release(ctx); err != nil {
					fail(err)
					return
				}
				c.Counts[i]++
			}
		}()
	}
	wg.Wait()
	c.Elapsed += time.Since(start)
	c.Acquired += n
	return firstErr
}

// Reset forgets the totals, such as those of a warm-up.
func (c *Contention) Reset() {
	clear(c.Counts)
	c.Acquired, c.Elapsed, c.Handoffs = 0, 0, nil
}

// Throughput is the acquisitions per second, holds included.
func (c *Contention) Throughput() float64 { return float64(c.Acquired) / c.Elapsed.Seconds() }

// Share is the fewest acquisitions of any competitor over the most: 1 is
// perfectly fair, 0 means one got none.
func (c *Contention) Share() float64 {
	return float64(slices.Min(c.Counts)) / float64(max(slices.Max(c.Counts), 1))
}

// HandoffP50 is the median of Handoffs (which it sorts).
func (c *Contention) HandoffP50() time.Duration {
	slices.Sort(c.Handoffs)
	return Percentile(c.Handoffs, 0.5)
}

// Report reports the throughput ("acq/s"), the share ("share") and the
// handoff's p50 and p99 ("handoff-p50-µs", "handoff-p99-µs"), each name
// suffixed with sfx.
func (c *Contention) Report(b *testing.B, sfx string) {
	b.ReportMetric(c.Throughput(), "acq/s"+sfx)
	b.ReportMetric(c.Share(), "share"+sfx)
	if len(c.Handoffs) > 0 {
		b.ReportMetric(Micros(c.HandoffP50()), "handoff-p50-µs"+sfx)
		b.ReportMetric(Micros(Percentile(c.Handoffs, 0.99)), "handoff-p99-µs"+sfx)
	}
}
