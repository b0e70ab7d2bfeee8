package lease

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Batcher sends the renewals of many leases of one Locker together: a
// renewal that comes due waits a short window (Gather) for the others that
// come due meanwhile, and one request renews them all (a script with many
// keys on Redis and on each Redlock node; on the SQL table one statement).
// A Locker holding ten
// thousand locks then sends a renewal request per batch, not per lock.
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
	// Send renews items in one request. It reports each item's verdict
	// (see Verdict) by its index, as soon as it knows it: a renewal
	// returns once its own is reported, so one lock that Send has to ask
	// about on its own (its row locked by another transaction, say) holds
	// back only itself. Items Send did not report when it returns get its
	// error (a transient failure: each renewal retries on its own
	// timing). report may be called from any goroutine until Send returns;
	// a second report of an item is ignored.
	Send func(ctx context.Context, items []T, report func(i int, v Verdict)) error
	// Go, if set, runs Send on a goroutine of its own that the Locker's
	// Close waits for (backend.Life.Go), so that the batch's leader, like
	// every member, returns as soon as its own verdict is in; it reports
	// false once the Locker is closing, and the batch then fails. Nil:
	// Send runs on the leader's goroutine, which returns when Send does.
	Go func(f func()) bool

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

	// Per item: closed once its verdict is in res.
	ready    []chan struct{}
	resMu    sync.Mutex
	res      []Verdict
	reported []bool
}

// report sets item i's verdict, once.
func (bt *batch[T]) report(i int, v Verdict) {
	bt.resMu.Lock()
	defer bt.resMu.Unlock()
	if i < 0 || i >= len(bt.reported) || bt.reported[i] {
		return
	}
	bt.res[i], bt.reported[i] = v, true
	close(bt.ready[i])
}

// Renew renews item in a batch with the other renewals of group that come
// due within the window, and reports its verdict. A group is the renewals
// that one request may carry together (the keys of one hash slot on a
// Redis Cluster, the rows of one table), of one TTL: the window is the
// leader's, and must be a small part of every member's retry time. ttl is
// item's lease (it sets the window of a batch item leads); ctx bounds
// item's wait, and the latest of the members' deadlines bounds the
// request.
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
		bt = &batch[T]{full: make(chan struct{})}
		b.open[group] = bt
	}
	i := len(bt.items)
	bt.items = append(bt.items, item)
	ready := make(chan struct{})
	bt.ready = append(bt.ready, ready)
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

	if !member {
		b.lead(ctx, group, ttl, bt)
	}
	select {
	case <-ready:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	bt.resMu.Lock()
	v := bt.res[i]
	bt.resMu.Unlock()
	return v.OK, v.Err
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
	bt.resMu.Lock()
	bt.res, bt.reported = make([]Verdict, len(items)), make([]bool, len(items))
	bt.resMu.Unlock()
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
	send := func() {
		defer cancel()
		err := b.Send(sctx, items, bt.report)
		if err == nil {
			err = errBatchAnswer // for the items Send did not report
		}
		for i := range items {
			bt.report(i, Verdict{Err: err})
		}
	}
	if b.Go == nil {
		send()
		return
	}
	if !b.Go(send) {
		cancel()
		for i := range items {
			bt.report(i, Verdict{Err: errBatchClosing})
		}
	}
}

// errBatchClosing fails the renewals of a batch that could not be sent
// because the Locker is closing.
var errBatchClosing = errors.New("lease: the Locker is closing: a batch of renewals was not sent")

// errBatchAnswer is a backend's bug: its Send returned without a verdict
// for every item. It fails the items left (retried).
var errBatchAnswer = batchAnswerError{}

type batchAnswerError struct{}

func (batchAnswerError) Error() string {
	return "lease: a batched renewal ended without a verdict for this renewal"
}
