package redlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/backoff"
)

// Waiting for a held key.
//
// An Acquire whose first round did not get the key subscribes to the key's
// release channel on every node (see subs), waits until a majority of the
// nodes confirmed the subscription (at most the node timeout), and tries
// again, so that a release between its first round and the subscription is
// not missed. Then it sleeps until a message arrives on any node (a release
// publishes on every node where it deleted the lock; the first message
// wakes the waiter) or its back-off ends, and tries again.
//
// The back-off of a round that no node granted is capped by the holder's
// remaining lease on the nodes that block a majority (a crashed holder
// announces nothing; its lease ending frees the key) and by the retry
// interval (the safety net for a lost message). After a round that some
// nodes granted (contenders split the nodes, or the holder has only a bare
// majority) or that failed without a holder, it starts at a few
// milliseconds and doubles up to the retry interval, with jitter so that
// contenders that split the nodes do not meet again: their partial grants
// look like holders to each other, but are deleted at once, silently. Waiters are not queued: every waiter woken by a
// release contends, and one wins (no fairness; see the package
// documentation).

// splitBackoff is the first back-off after a round that failed with no
// holder of a majority; it doubles up to the retry interval.
const splitBackoff = 5 * time.Millisecond

// maxUnreachableRounds is how many rounds in a row may fail to reach a
// majority before Acquire gives up with ErrNoQuorum.
const maxUnreachableRounds = 3

func (l *Locker) wait(ctx context.Context, key string, k keys, tm timing) (*Handle, error) {
	h, r, err := l.round(ctx, key, k, tm, nil, -1)
	if h != nil || err != nil {
		return h, err
	}
	unreachable := 0
	if r.unreachable() {
		unreachable++
	}
	w := l.subs.watch(k.channel, "")
	defer w.leave()
	if err := w.awaitSubscribed(ctx, l.quorum, tm.nodeTimeout); err != nil {
		return nil, l.life.Why(ctx, err)
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	// After a round that no holder of a majority explains: a few
	// milliseconds, doubling up to the retry interval, jittered.
	pause := backoff.New(splitBackoff, l.cfg.RetryInterval)
	for {
		last := r
		h, r, err = l.round(ctx, key, k, tm, nil, -1)
		if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil, l.waitEnded(ctx, last)
		}
		if h != nil || err != nil {
			return h, err
		}
		if r.unreachable() {
			// A majority failed or did not answer: give up after a few
			// rounds in a row (one slow round is not an outage).
			if unreachable++; unreachable >= maxUnreachableRounds {
				return nil, r.err()
			}
		} else {
			unreachable = 0
		}
		var d time.Duration
		if r.held && r.holderLeft > 0 {
			pause.Reset()
			d = min(r.holderLeft+time.Millisecond, l.cfg.RetryInterval)
			d += backoff.Jitter(min(d/4, 20*time.Millisecond) + time.Millisecond)
		} else {
			d = pause.Next()
		}
		timer.Reset(d)
		select {
		case <-w.wake:
		case <-timer.C:
		case <-ctx.Done(): // also when Close begins (Life.Enter)
			return nil, l.waitEnded(ctx, r)
		}
		timer.Stop()
	}
}

// waitEnded is the error of an Acquire whose context ended while it waited
// after round r: Life.Why's (locker.ErrClosed when Close ended it), and, when r failed for a reason of its own
// (nodes that failed, a round too slow for its lease) rather than another
// holder, that reason in words (not wrapped: the call did not end because
// of it).
func (l *Locker) waitEnded(ctx context.Context, r roundResult) error {
	err := l.life.Why(ctx, nil)
	if errors.Is(err, locker.ErrClosed) || r.why == "" && r.failed == 0 {
		return err
	}
	return fmt.Errorf("%w (the last round failed: %v)", err, r.err())
}
