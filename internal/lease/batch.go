package lease

import (
	"context"
	"sync"
	"time"
)

// Batcher sends the renewals of many leases of one Locker together: a
// renewal that comes due waits a short window (Gather) for the others that
// come due meanwhile, and one request renews them all (a script with many
// keys on Redis, one statement on SQL). A Locker holding ten thousand locks
// then sends a renewal request per batch, not per lock.
//
// It needs no change to the timing of a lease: Renewal calls its
// RenewConfig.Renew as before, on the renewal's own timer goroutine, and the
// backend's Renew hands its lock to Batcher.Renew, which returns once the
// batch holding it has been answered. The lease counts from the moment its
// renewal came due (Renewal's sent), which is before the batch's request
// left: the server reset the lease no earlier than that, so the wait makes
// the lease shorter by at most the window, never longer than the server's.
//
// Renewals line up by themselves: the members of a batch were all sent
// within one window, so their next renewals come due within one window too
// (a third of the TTL later) and meet in one batch again. Locks taken later
// join the batch that comes due first after their own renewal.
//
// The first renewal of a batch (its leader) waits the window and sends the
// request on its own goroutine, which its Locker counts as active (the
// renewal runs inside RenewConfig.Go): Close waits for the request as for
// any renewal. A member whose lease stops meanwhile (a Release) leaves the
// batch without waiting; the request goes out for the others, and a
// renewal of a lock that is no longer held is refused by the server's owner
// check, as any late renewal is.
type Batcher[T any] struct {
	// Max is the most renewals one request carries; 0 means 256.
	Max int
	// Gather is the longest a renewal waits for others; the window of one
	// batch is the least of Gather and a sixtieth of its leader's TTL (a
	// third of the renewal's retry time, TTL/20), so that the wait never
	// reads as a slow renewal. 0 means 50ms.
	Gather time.Duration
	// Send renews items in one request. It returns one verdict per item,
	// in order (see Verdict), or an error for them all (a transient
	// failure: each renewal retries on its own timing).
	Send func(ctx context.Context, items []T) ([]Verdict, error)

	mu   sync.Mutex
	open map[uint64]*batch[T] // the batch filling up, per group
}

// Verdict is a batched renewal's answer for one lease, as RenewConfig.Renew
// gives it: OK when the lease was reset; not OK with a nil Err when the
// lock was no longer its holder's; an Err when that could not be told for
// this lease (a Redlock round that reached too few nodes for it), which
// its renewal retries.
type Verdict struct {
	OK  bool
	Err error
}

// batch is one request's worth of renewals.
type batch[T any] struct {
	items     []T
	deadline  time.Time     // the latest deadline of the members' contexts
	unbounded bool          // a member's context has no deadline
	full      chan struct{} // closed when items reached Max
	done      chan struct{} // closed once res and err are set
	res       []Verdict
	err       error
}

// Renew renews item in a batch with the other renewals of group (the
// renewals that one request may carry together: every one on a single
// Redis server, the keys of one hash slot on a Redis Cluster) that come due
// within the window, and reports its verdict. ttl is item's lease (it
// sets the window of a batch item leads); ctx bounds item's wait, and the
// latest of the members' deadlines bounds the request.
func (b *Batcher[T]) Renew(ctx context.Context, group uint64, ttl time.Duration, item T) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	max := b.Max
	if max <= 0 {
		max = 256
	}
	dl, hasDL := ctx.Deadline()
	b.mu.Lock()
	if b.open == nil {
		b.open = make(map[uint64]*batch[T])
	}
	bt, member := b.open[group]
	if !member {
		bt = &batch[T]{full: make(chan struct{}), done: make(chan struct{})}
		b.open[group] = bt
	}
	i := len(bt.items)
	bt.items = append(bt.items, item)
	if !hasDL {
		bt.unbounded = true
	} else if dl.After(bt.deadline) {
		bt.deadline = dl
	}
	if len(bt.items) >= max {
		delete(b.open, group) // the next renewal starts a new batch
		close(bt.full)
	}
	b.mu.Unlock()

	if member {
		select {
		case <-bt.done:
			if bt.err != nil {
				return false, bt.err
			}
			return bt.res[i].OK, bt.res[i].Err
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	b.lead(ctx, group, ttl, bt)
	if bt.err != nil {
		return false, bt.err
	}
	return bt.res[0].OK, bt.res[0].Err
}

// lead waits out bt's window (or until it is full), closes it to new
// members and sends it. The request goes out even if the leader's own ctx
// has ended meanwhile (its lock was released): the others still need it.
func (b *Batcher[T]) lead(ctx context.Context, group uint64, ttl time.Duration, bt *batch[T]) {
	gather := b.Gather
	if gather <= 0 {
		gather = 50 * time.Millisecond
	}
	if w := min(gather, ttl/60); w > 0 {
		t := time.NewTimer(w)
		select {
		case <-t.C:
		case <-bt.full:
		}
		t.Stop()
	}
	b.mu.Lock()
	if b.open[group] == bt {
		delete(b.open, group)
	}
	items, dl, unbounded := bt.items, bt.deadline, bt.unbounded
	b.mu.Unlock()

	// The request may take as long as the member with the most time left
	// may wait: a member closer to its deadline (a lock whose renewals
	// have been failing) stops waiting at its own, and does not cut the
	// others' request short.
	sctx := context.WithoutCancel(ctx)
	cancel := context.CancelFunc(func() {})
	if !unbounded {
		sctx, cancel = context.WithDeadline(sctx, dl)
	}
	res, err := b.Send(sctx, items)
	cancel()
	if err == nil && len(res) != len(items) {
		err = errBatchAnswer
	}
	bt.res, bt.err = res, err
	close(bt.done)
}

// errBatchAnswer is a backend's bug: its Send answered a batch with a
// verdict count other than the batch's. It fails the batch (retried).
var errBatchAnswer = batchAnswerError{}

type batchAnswerError struct{}

func (batchAnswerError) Error() string {
	return "lease: a batched renewal was answered with a verdict count other than its renewals'"
}
