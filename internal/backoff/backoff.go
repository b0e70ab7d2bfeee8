// Package backoff is the one jittered exponential back-off of the project:
// the pause between the tries of a loop that nothing wakes (a campaign whose
// backend failed, a listener reconnecting, a clean-up retried).
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff doubles a pause from Min up to Max; each Next is jittered in
// [d/2, d] ("equal jitter"), so that the many tries of one moment spread
// out instead of coming back in step. The zero value pauses 0; a Backoff is
// not safe for concurrent use.
type Backoff struct {
	Min, Max time.Duration
	cur      time.Duration
}

// New returns a Backoff from min up to max.
func New(min, max time.Duration) *Backoff { return &Backoff{Min: min, Max: max} }

// Next returns the next pause and doubles the one after it.
func (b *Backoff) Next() time.Duration {
	if b.cur < b.Min {
		b.cur = b.Min
	}
	d := min(b.cur, b.Max)
	b.cur = min(2*b.cur, b.Max)
	return Jitter(d)
}

// Reset starts again from Min: the last try succeeded.
func (b *Backoff) Reset() { b.cur = 0 }

// Wait sleeps Next, and reports false if ctx ended first.
func (b *Backoff) Wait(ctx context.Context) bool { return Sleep(ctx, b.Next()) }

// Jitter returns a random duration in [d/2, d]; d <= 0 gives 0.
func Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d/2 + rand.N(d/2+1)
}

// Sleep waits d, or until one of ctxs ends; it reports whether the whole
// of d passed.
func Sleep(ctx context.Context, d time.Duration, more ...<-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	var extra <-chan struct{}
	if len(more) > 0 {
		extra = more[0]
	}
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-extra:
		return false
	}
}
