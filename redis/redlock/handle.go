package redlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/lease"
)

var _ locker.AtRisker = (*Handle)(nil)

var _ locker.Handle = (*Handle)(nil)

// Handle is one lock held on a majority of the nodes. It is safe for
// concurrent use.
type Handle struct {
	l    *Locker
	k    keys
	tm   timing
	sent time.Time    // when the granting round's requests left
	c    lease.Handle // identity, state, lease and the verdicts (internal/lease)
}

func newHandle(l *Locker, key string, k keys, owner string, token int64, tm timing, sent time.Time) *Handle {
	h := &Handle{l: l, k: k, tm: tm, sent: sent}
	h.c.Init(key, owner, token, tm.ttl, backend.NewState(), lease.Proto{
		Ops: (*leaseOps)(h), Server: "the nodes", Gone: "it was deleted on a majority of the nodes", Log: backend.Log{L: l.cfg.Logger},
	})
	return h
}

// leaseOps is the Handle as its lease handle's protocol calls
// (lease.Ops): (*leaseOps)(h) is a pointer of another type, so it costs no
// allocation and adds no methods to Handle's own.
type leaseOps Handle

func (o *leaseOps) Release(ctx context.Context) (bool, error) { return (*Handle)(o).release(ctx) }
func (o *leaseOps) Cleanup() bool                             { return (*Handle)(o).cleanup() }
func (o *leaseOps) Forget()                                   { o.l.unregister((*Handle)(o)) }
func (o *leaseOps) Enter() (bool, func())                     { return o.l.enterFn() }
func (o *leaseOps) Renew(ctx context.Context) (bool, error)   { return (*Handle)(o).renew(ctx) }

// Key returns the key as the caller gave it.
func (h *Handle) Key() string { return h.c.Key }

// Token returns the fencing token: the counter value a majority of the
// nodes returned to the grant, else the largest of the granting nodes'
// counters, written back to a majority of them before Acquire returned
// (a lock family's, claimed there: greater when another holder had
// claimed that value), plus the Locker's token base (WithTokenBase).
// See "Fencing tokens" in the package documentation for why it is larger
// than every earlier holder's.
func (h *Handle) Token() int64 { return h.c.Token }

// Owner returns the random owner token this lock carries on the nodes, for
// operators and tests. Whoever knows it can release or renew the lock.
func (h *Handle) Owner() string { return h.c.Owner }

// TTL returns the lease of the lock on each node.
func (h *Handle) TTL() time.Duration { return h.c.TTL }

// Done is closed once the lock is released or lost.
func (h *Handle) Done() <-chan struct{} { return h.c.Done() }

// Err is nil while the lock is held, then locker.ErrReleased or an error
// wrapping locker.ErrLost.
func (h *Handle) Err() error { return h.c.Err() }

// AtRisk is locker.AtRisker's: at risk from a renewal that failed (it is
// retried) until one succeeds; the lock is lost if none does before its
// lease runs out.
func (h *Handle) AtRisk() (bool, <-chan struct{}) { return h.c.AtRisk() }

// Validity returns until when the lock is surely held on a majority of the
// nodes, on this process's monotonic clock: the send time of the last
// successful acquiring or renewing round plus the TTL minus the drift.
func (h *Handle) Validity() time.Time {
	if ls := h.c.Lease(); ls != nil {
		return ls.Deadline()
	}
	return h.sent.Add(h.tm.ttl - h.tm.drift)
}

// start keeps the lease: a renewal round every TTL/3, and the loss
// declared at the validity's end when no renewal round succeeded on a
// majority in time (internal/lease: runtime timers, no goroutine).
func (h *Handle) start() {
	h.c.Start(h.sent, true, lease.RenewConfig{Drift: h.tm.drift, Go: h.l.runFn})
}

// renew extends the lease on every node where the lock is still ours. It
// reports ok when a majority extended it; ok=false when so many nodes said
// it is not ours that no majority can be; an error otherwise (nodes that
// failed or did not answer), which internal/lease retries until the
// validity ends.
func (h *Handle) renew(ctx context.Context) (bool, error) {
	return h.l.renewals.Renew(ctx, uint64(h.tm.ttl.Microseconds()), h.tm.ttl, h)
}

// renewOne is renew in a round of its own.
func (h *Handle) renewOne(ctx context.Context) (bool, error) {
	res, err := fanout(h.l, ctx, ctx, h.l.closing, h.l.all, h.tm.nodeTimeout,
		func(ctx context.Context, _ int, c goredis.UniversalClient) (bool, error) {
			return runExtend(ctx, c, h.k, h.c.Owner, h.tm.ttl)
		}, nil, func(o outcome[bool]) bool { // a majority either way
			return h.l.renewDecided(func(i int) (bool, bool) { return o.ok(i), o.ok(i) && o.v[i] })
		})
	if err != nil {
		return false, err
	}
	return h.l.renewVerdict(func(i int) (bool, bool) { return res.ok(i), res.ok(i) && res.v[i] }, res.err)
}

// renewDecided reports whether a renewal round's answers so far settle it:
// a majority of distinct servers extended the lock, or so many nodes said
// it is not ours that no majority can be. node(i) tells whether node i
// answered and whether it extended the lock.
func (l *Locker) renewDecided(node func(i int) (answered, extended bool)) bool {
	var yes []int
	no := 0
	for i := range l.clients {
		switch answered, extended := node(i); {
		case extended:
			yes = append(yes, i)
		case answered:
			no++
		}
	}
	return l.vet.distinct(yes) >= l.quorum || no >= len(l.clients)-l.quorum+1
}

// renewVerdict is a renewal round's outcome, from each node's answer
// (node(i): answered, extended) and the errors of the nodes that did not
// answer: ok when a majority of distinct servers extended the lock;
// ok=false when so many said it is not ours that no majority can be; an
// error otherwise.
func (l *Locker) renewVerdict(node func(i int) (answered, extended bool), errs []error) (bool, error) {
	var extended, gone, failed []int
	for i := range l.clients {
		switch answered, ext := node(i); {
		case !answered:
			failed = append(failed, i)
		case ext:
			extended = append(extended, i)
		default:
			gone = append(gone, i)
		}
	}
	n, q := len(l.clients), l.quorum
	switch {
	case l.vet.distinct(extended) >= q:
		// One per server: a node the Locker has not vetted, or two names
		// of one server, do not make a majority (see vet.go).
		return true, nil
	case len(gone) >= n-q+1:
		return false, nil
	}
	counted := l.vet.distinct(extended)
	if len(failed) == 0 {
		// Every node answered, and some that extended do not count.
		return false, fmt.Errorf("renewal extended the lock on %d of %d nodes, but they are %d servers compared with each other (need %d): the rest answered for the first time or as another server, and count once an acquire has compared them; %d no longer held it",
			len(extended), n, counted, q, len(gone))
	}
	first := failed[0]
	return false, fmt.Errorf("renewal reached only %d of %d nodes (need %d); %d no longer held it; %s: %w",
		counted, n, q, len(gone), l.addrs[first], errs[first])
}

// renewMany renews the leases of hs, locks of one TTL, in one round of a
// script per node (lease.Batcher's Send): each lock's verdict is the one
// its own round would have had from the same answers.
func (l *Locker) renewMany(ctx context.Context, hs []*Handle, report func(int, lease.Verdict)) error {
	if len(hs) == 1 {
		ok, err := hs[0].renewOne(ctx)
		report(0, lease.Verdict{OK: ok, Err: err})
		return nil
	}
	keys := make([]string, len(hs))
	args := make([]any, 0, 3*len(hs))
	for j, h := range hs {
		kind := "m"
		keys[j] = h.k.lock
		if h.k.kind == readLock {
			kind, keys[j] = "r", h.k.base+readersSuffix
		}
		args = append(args, kind, h.c.Owner, millis(h.tm.ttl))
	}
	node := func(o outcome[[]bool], j int) func(i int) (bool, bool) {
		return func(i int) (bool, bool) { return o.ok(i), o.ok(i) && o.v[i][j] }
	}
	res, err := fanout(l, ctx, ctx, l.closing, l.all, hs[0].tm.nodeTimeout,
		func(ctx context.Context, _ int, c goredis.UniversalClient) ([]bool, error) {
			vals, err := runScript(ctx, c, extendManyScript, keys, args...).Int64Slice()
			if err != nil {
				return nil, err
			}
			if len(vals) != len(keys) {
				return nil, fmt.Errorf("redlock: the batched renewal of %d locks answered %d verdicts", len(keys), len(vals))
			}
			out := make([]bool, len(vals))
			for j, v := range vals {
				out[j] = v == 1
			}
			return out, nil
		}, nil, func(o outcome[[]bool]) bool {
			for j := range hs {
				if !l.renewDecided(node(o, j)) {
					return false
				}
			}
			return true
		})
	if err != nil {
		return err
	}
	for i := range l.clients {
		if !res.ok(i) && (goredis.HasErrorPrefix(res.err[i], "CROSSSLOT") || goredis.HasErrorPrefix(res.err[i], "TRYAGAIN")) {
			// A node in cluster mode refuses keys of several slots in one
			// script: this batch renews one by one.
			for j, h := range hs {
				ok, err := h.renewOne(ctx)
				report(j, lease.Verdict{OK: ok, Err: err})
			}
			return nil
		}
	}
	for j := range hs {
		ok, err := l.renewVerdict(node(res, j), res.err)
		report(j, lease.Verdict{OK: ok, Err: err})
	}
	return nil
}

// releaseCounts runs the owner-checked delete on every node, announcing it,
// and counts the answers. Its requests are not bound by ctx, which only
// bounds the wait.
func (h *Handle) releaseCounts(ctx context.Context) (deleted, notOurs int, failed []error, err error) {
	res, err := fanout(h.l, ctx, context.Background(), nil, h.l.all, h.tm.nodeTimeout,
		func(ctx context.Context, _ int, c goredis.UniversalClient) (bool, error) {
			return runRelease(ctx, c, h.k, h.c.Owner)
		}, nil, nil)
	for i := range h.l.clients {
		switch {
		case !res.ok(i):
			failed = append(failed, fmt.Errorf("%s: %w", h.l.addrs[i], res.err[i]))
		case res.v[i]:
			deleted++
		default:
			notOurs++
		}
	}
	return deleted, notOurs, failed, err
}

// release is the owner-checked delete of Release and of Close
// (lease.Ops.Release): ours when a majority deleted it, not ours when
// every node answered and fewer than a majority still held it.
func (h *Handle) release(ctx context.Context) (bool, error) {
	// Forgotten first: a Close that begins meanwhile leaves this release
	// alone (its requests are not bound by ctx nor by Close).
	h.l.unregister(h)
	deleted, notOurs, failed, err := h.releaseCounts(ctx)
	switch {
	case deleted >= h.l.quorum:
		return true, nil
	case err != nil || len(failed) > 0:
		if err == nil {
			err = errors.Join(failed...)
		}
		return false, fmt.Errorf("deleted on %d of %d nodes, %d no longer held it, %d failed or did not answer: %w",
			deleted, len(h.l.clients), notOurs, len(failed), err)
	}
	return false, nil
}

// cleanup deletes the lock in the background on every node where it may
// still be ours, announcing it (lease.Ops.Cleanup), unless the Locker is
// closing.
func (h *Handle) cleanup() bool {
	if !h.l.enter() {
		return false
	}
	go func() {
		defer h.l.exit()
		_ = h.l.cleanup(context.Background(), h.k, h.c.Owner, h.l.all, h.tm.nodeTimeout, true, nil, "")
	}()
	return true
}

// Release deletes the lock on every node where it is still ours (compare
// and delete, in parallel, each bounded by the node timeout), which wakes
// the nodes' waiters. It never deletes another holder's lock. It succeeds
// when a majority deleted it. When fewer could be reached the lock is given
// up all the same (renewal stops, Err reports locker.ErrReleased) and
// expires within its TTL on the nodes not reached; the error says so. When
// every node answered and fewer than a majority still held it, the lock had
// been lost and the error wraps locker.ErrLost.
func (h *Handle) Release(ctx context.Context) error { return h.c.Release(ctx) }

// releaseByClose is Close's release of a lock it still held.
func (h *Handle) releaseByClose(ctx context.Context) error {
	h.c.Stop()
	ours, err := h.release(ctx)
	return h.c.Closed(ours, err)
}
