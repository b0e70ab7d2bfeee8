package redlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-locker/locker"
)

// Waiting for a held key: every Acquire, the mutex's as a family's, is
// famWait (families.go). A first round that does not get the key queues the
// waiter on the nodes that refuse it (the queue of the key's names, ":q" and
// ":qx", ordered by tickets that the nodes agree on); the waiter then
// subscribes to the key's channel (or had watched it before its first round,
// when it was subscribed already: see pubsub.go), and runs a round when a release names it
// (the release wakes the head of the queue, not every waiter), when the
// holder's lease ends (a crashed holder announces nothing), or when its place
// in the queue needs refreshing. After a round that no holder of a majority
// explains (contenders split the nodes, or nodes failed) it backs off a few
// milliseconds, doubling, with jitter.

// splitBackoff is the first back-off after a round that failed with no
// holder of a majority; it doubles up to the retry interval.
const splitBackoff = 5 * time.Millisecond

// maxUnreachableRounds is how many rounds in a row may fail to reach a
// majority before Acquire gives up with ErrNoQuorum.
const maxUnreachableRounds = 3

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
