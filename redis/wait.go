package redis

import (
	"context"
	"time"
)

// Waiting for a held key.
//
// An Acquire that finds the key held puts itself in the key's queue on the
// server, in the same script and round trip (acquireScript in "wait" mode),
// and sleeps. A release deletes the lock and publishes the owner token of
// the first live waiter in the queue on the wake-up channel of that
// waiter's Locker, and on no other: one message per release, to one waiter,
// however many wait (no herd). The waiter then tries again, and the script
// lets it in because it is at the head of the queue; a later Acquire of the
// free key queues behind it. So waiters are served in the order they came,
// across Lockers and processes, and an acquisition under contention costs
// three requests: the attempt that queued, the one that took the lock, and
// the release.
//
// A waiter's entry carries a deadline (queueLease after its last attempt);
// every attempt refreshes it, and a waiter makes one every recheck interval
// (a third of queueLease at most) even when nobody tells it anything. The
// scripts drop entries past their deadline: those of waiters that crashed
// or were cut off without leaving. A waiter whose wait ends without the lock
// (context, Close, an error) leaves the queue at once (leaveScript), and if
// the turn had been given to it, the script passes it on. So a dead waiter
// holds up the key for at most queueLease plus the next waiter's recheck
// interval, and a cancelled one not at all.
//
// Notifications only make waiting prompt; safety does not depend on them.
// A lost message (a Pub/Sub reconnect, a failover) costs the waiter whose
// turn it was at most its recheck interval; the head of the queue also
// tries again when the holder's lease runs out (a crashed holder sends no
// message).
//
// Each Locker subscribes to its channel of a key (one per key and Locker,
// see hub) when one of its Acquires first waits on it, and keeps the
// subscription for subscriptionLinger after the last one left, so that a
// key under steady contention costs no (un)subscribe per acquisition. A
// waiter whose Locker was already subscribed (confirmed by the server before
// its first attempt was sent) cannot miss its turn; one that had to
// subscribe tries once more after the subscription is confirmed, since a
// release in between went unheard.

// minQueueLease is the shortest life of a queue entry between refreshes.
const minQueueLease = 150 * time.Millisecond

// queueLease is how long a waiter's queue entry lives without a refresh: a
// third of the TTL it asks for (at least minQueueLease), so that a waiter
// that dies in the queue holds up the key for less than a dead holder does.
func queueLease(ttl time.Duration) time.Duration {
	return max(ttl/3, minQueueLease)
}

// recheckEvery is the longest a waiter sleeps between two attempts: its
// refresh of the queue entry, and the safety net for a lost notification.
// It is at most a third of the entry's lease, so that a waiter whose
// request is slow, or that misses one refresh, keeps its place.
func (l *Locker) recheckEvery(ttl time.Duration) time.Duration {
	return min(l.cfg.RetryInterval, queueLease(ttl)/3)
}

// sleepFor is how long a waiter sleeps after an attempt that did not get the
// lock: at most the recheck interval, and for the head of the queue only
// until the holder's lease runs out (plus a millisecond, as Redis expires a
// key only once its deadline has passed), since a crashed holder does not
// announce its end.
func (l *Locker) sleepFor(res acquireResult, ttl time.Duration) time.Duration {
	d := l.recheckEvery(ttl)
	if res.place == 0 && res.pttl >= 0 && res.pttl+time.Millisecond < d {
		d = res.pttl + time.Millisecond
	}
	return d
}

// wait is Acquire past the argument checks: it queues, sleeps until its turn
// (or the recheck interval), and tries again, until it holds the key or ctx
// (from Life.Enter: it ends when Close begins too) ends.
func (l *Locker) wait(ctx context.Context, a *attempt) (h *Handle, err error) {
	a.mode = modeWait
	// Listening already (another Acquire of this Locker waits on the key,
	// or did a moment ago): then the subscription is in place before the
	// first attempt queues, and no turn can go unheard.
	w := l.hub.join(ctx, a.k.wake, a.owner)
	defer func() {
		if w != nil {
			w.leave()
		}
		if h == nil {
			// Out of the queue at once, and the turn passed on if it had
			// come. (An attempt abandoned in flight does this again once
			// it has ended, in case it queued after this.)
			l.leave(a.k, a.owner)
		}
	}()

	// The uncontended case: one round trip, no subscription.
	h, res, err := a.tryFresh(ctx)
	if err != nil || h != nil {
		return h, err
	}
	if w == nil {
		// Subscribe, then try again before sleeping: the turn may have
		// come between the first attempt and the subscription.
		w = l.hub.watch(ctx, a.k.wake, a.owner)
		if err := w.awaitSubscribed(ctx, l.cfg.RetryInterval); err != nil {
			return nil, l.life.Why(ctx, err)
		}
		if h, res, err = a.tryFresh(ctx); err != nil || h != nil {
			return h, err
		}
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if w.hasMoved() {
			// The key's slot moved to another Cluster master: listen
			// there, then try again before sleeping, as above.
			w = l.hub.rewatch(ctx, w, min(l.recheckEvery(a.ttl), time.Second))
			if err := w.awaitSubscribed(ctx, l.cfg.RetryInterval); err != nil {
				return nil, l.life.Why(ctx, err)
			}
		} else {
			timer.Reset(l.sleepFor(res, a.ttl))
			select {
			case <-w.wake:
			case <-timer.C:
			case <-ctx.Done(): // also when Close begins (Life.Enter)
				return nil, l.life.Why(ctx, nil)
			}
			timer.Stop()
		}
		if h, res, err = a.tryFresh(ctx); err != nil || h != nil {
			return h, err
		}
	}
}

// leave takes owner's entry out of k's queue in the background (see
// leaveScript), and deletes the lock if an abandoned attempt took it; Close
// waits for it, boundedly (see background). When it fails the entry goes at
// its deadline.
func (l *Locker) leave(k keys, owner string) {
	l.background(func(ctx context.Context) { _ = l.runLeave(ctx, k, owner) })
}
