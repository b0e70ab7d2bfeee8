package memlock

import (
	"container/heap"
	"context"
	"fmt"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

var _ locker.AtRisker = (*handle)(nil)

// handle is a Locker's grip on one key: the client side of a grant.
type handle struct {
	l     *Locker
	g     *grant
	token int64 // the Locker's token base plus the grant's token

	risk backend.Risk // a renewal failed (the Locker is cut off: a test hook)

	// Guarded by l.mu.
	next  time.Time // when the watchdog renews the lease next
	index int       // position in l.held; -1 once the Locker has let go of it
}

func (h *handle) Key() string           { return h.g.key }
func (h *handle) Token() int64          { return h.token }
func (h *handle) Done() <-chan struct{} { return h.g.state.Done() }
func (h *handle) Err() error            { return h.g.state.Err() }

// AtRisk is locker.AtRisker's: at risk from a renewal that failed until
// one succeeds. A Locker's renewals reach its Store in the same process
// and do not fail: they fail only while the Locker is cut off from its
// Store by the test hook that the conformance suite uses as a partition.
// memlock implements AtRisker all the same, so that code and tests
// written against it meet the interface as on the network backends.
func (h *handle) AtRisk() (bool, <-chan struct{}) { return h.risk.AtRisk() }

// TTL is the lease of the lock: exactly the TTL asked (memlock counts in
// nanoseconds, like time.Duration).
func (h *handle) TTL() time.Duration { return h.g.ttl }

// Release gives the lock up and hands the key to the next waiter. It fails
// with an error wrapping locker.ErrReleased if the handle was released
// already, and with one wrapping locker.ErrLost if the lease expired first;
// then the store, which compares holders, leaves the key to whoever has it
// now. Release never blocks, so ctx is not consulted.
//
// A Locker cut off from its store (the test hook cut) cannot release: the
// lock is given up all the same — the watchdog stops renewing it, the handle
// reports locker.ErrReleased — and its lease runs out in the store. The
// error says so. A network backend does the same when the server cannot be
// reached, so that a failed Release never leaves a lock that a watchdog
// keeps alive after the network heals.
func (h *handle) Release(ctx context.Context) error {
	l := h.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := h.g.state.Err(); err != nil {
		return backend.KeyError("release", h.g.key, err)
	}
	if l.crashed { // a dead process releases nothing
		return backend.KeyError("release", h.g.key, locker.ErrClosed)
	}
	l.forgetLocked(h)
	if l.isCut {
		h.g.state.End(locker.ErrReleased)
		return backend.KeyError("release", h.g.key, fmt.Errorf("%w; the lock was given up and its lease of %v runs out in the store", errUnreachable, h.g.ttl))
	}
	if !l.store.release(h.g, locker.ErrReleased) {
		// The lease ran out (the store ended the state with ErrLost), or the
		// key was taken away from this holder (the state is still open).
		h.g.state.End(errTakenAway)
		return backend.KeyError("release", h.g.key, h.g.state.Err())
	}
	return nil
}

// holdLocked makes a handle for a grant the store just gave l and puts it
// under the watchdog. Once Close (or crash) has begun, it gives the grant
// back instead and fails with locker.ErrClosed: Close could not see it.
func (l *Locker) holdLocked(g *grant) (*handle, error) {
	token, err := l.cfg.Token(g.token)
	if err != nil { // cannot happen: the store counts from 1, one per grant
		l.store.release(g, locker.ErrReleased)
		return nil, err
	}
	h := &handle{l: l, g: g, token: token, next: g.start.Add(g.ttl / 3)}
	if !l.life.Hold(h) {
		l.store.release(g, locker.ErrReleased)
		return nil, locker.ErrClosed
	}
	heap.Push(&l.held, h)
	if l.alarm.IsZero() || h.next.Before(l.alarm) {
		// The watchdog sleeps until l.alarm; wake it to rearm its timer
		// for this earlier renewal. A buffered send: one pending wake is
		// enough. (A later renewal needs no wake: the watchdog looks at
		// the queue again whenever its timer fires.)
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
	return h, nil
}

// forgetLocked takes h from the watchdog and from the handles Close
// releases.
func (l *Locker) forgetLocked(h *handle) {
	l.life.Drop(h)
	if h.index >= 0 {
		heap.Remove(&l.held, h.index)
	}
}

// watchdog is the Locker's one goroutine. It renews each held lease every
// TTL/3, sleeping on a single timer until the earliest renewal is due; it
// never polls. It returns when Close or crash begins.
func (l *Locker) watchdog() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		l.mu.Lock()
		l.renewDueLocked(time.Now())
		if len(l.held) > 0 {
			l.alarm = l.held[0].next
			timer.Reset(time.Until(l.alarm))
		} else {
			l.alarm = time.Time{}
			timer.Stop()
		}
		l.mu.Unlock()

		select {
		case <-l.life.Closing().Done():
			return
		case <-l.wake:
		case <-timer.C:
		}
	}
}

// renewDueLocked renews every lease whose renewal is due by now, and drops
// the handles that were lost.
func (l *Locker) renewDueLocked(now time.Time) {
	for len(l.held) > 0 && !l.held[0].next.After(now) {
		h := l.held[0]
		switch {
		case h.g.state.Ended():
			// Lost: the store expired the lease and ended the handle.
			l.log().Warn("locker: lock lost", backend.LogKey(h.g.key), backend.Err(h.g.state.Err()))
			heap.Pop(&l.held)
		case l.isCut:
			// Unreachable: at risk; try again soon. If the lease runs out
			// first, the store ends the handle with ErrLost.
			if h.risk.Set(true) {
				l.log().Warn("locker: lock at risk: renewal failed, retrying", backend.LogKey(h.g.key), backend.Err(errUnreachable))
			}
			h.next = now.Add(h.g.ttl / 20)
			heap.Fix(&l.held, 0)
		case l.store.renew(h.g):
			if h.risk.Set(false) {
				l.log().Info("locker: lock no longer at risk: renewal succeeded", backend.LogKey(h.g.key))
			}
			h.next = now.Add(h.g.ttl / 3)
			heap.Fix(&l.held, 0)
		default:
			// Too late: the lease had run out, and renew ended the handle;
			// or the key was taken away from this holder, which hears of it
			// now (End keeps the first error when renew already ended it).
			h.g.state.End(backend.KeyError("renew", h.g.key, errTakenAway))
			l.log().Warn("locker: lock lost", backend.LogKey(h.g.key), backend.Err(h.g.state.Err()))
			heap.Pop(&l.held)
		}
	}
}

// renewQueue is a min-heap of handles by next renewal (container/heap).
type renewQueue []*handle

func (q renewQueue) Len() int           { return len(q) }
func (q renewQueue) Less(i, j int) bool { return q[i].next.Before(q[j].next) }
func (q renewQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *renewQueue) Push(x any) {
	h := x.(*handle)
	h.index = len(*q)
	*q = append(*q, h)
}
func (q *renewQueue) Pop() any {
	old := *q
	h := old[len(old)-1]
	old[len(old)-1] = nil
	h.index = -1
	*q = old[:len(old)-1]
	return h
}
