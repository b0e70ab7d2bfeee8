package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/renew"
)

var _ locker.Handle = (*Handle)(nil)

// Handle is one lock held on a majority of the nodes. It is safe for
// concurrent use.
type Handle struct {
	l     *Locker
	key   string
	k     keys
	owner string
	token int64
	tm    timing
	sent  time.Time // when the granting round's requests left
	st    *backend.State

	mu        sync.Mutex
	lease     renew.Slot
	releasing bool
}

func newHandle(l *Locker, key string, k keys, owner string, token int64, tm timing, sent time.Time) *Handle {
	return &Handle{l: l, key: key, k: k, owner: owner, token: token, tm: tm, sent: sent, st: backend.NewState()}
}

// Key returns the key as the caller gave it.
func (h *Handle) Key() string { return h.key }

// Token returns the fencing token: the largest of the granting nodes'
// counters, written back to a majority of them before Acquire returned.
// See "Fencing tokens" in the package documentation for why it is larger
// than every earlier holder's.
func (h *Handle) Token() int64 { return h.token }

// Owner returns the random owner token this lock carries on the nodes, for
// operators and tests. Whoever knows it can release or renew the lock.
func (h *Handle) Owner() string { return h.owner }

// TTL returns the lease of the lock on each node.
func (h *Handle) TTL() time.Duration { return h.tm.ttl }

// Done is closed once the lock is released or lost.
func (h *Handle) Done() <-chan struct{} { h.lease.Check(); return h.st.Done() }

// Err is nil while the lock is held, then locker.ErrReleased or an error
// wrapping locker.ErrLost.
func (h *Handle) Err() error { h.lease.Check(); return h.st.Err() }

// Validity returns until when the lock is surely held on a majority of the
// nodes, on this process's monotonic clock: the send time of the last
// successful acquiring or renewing round plus the TTL minus the drift.
func (h *Handle) Validity() time.Time {
	if ls := h.lease.Get(); ls != nil {
		return ls.Deadline()
	}
	return h.sent.Add(h.tm.ttl - h.tm.drift)
}

// start keeps the lease: a renewal round every TTL/3, and the loss
// declared at the validity's end when no renewal round succeeded on a
// majority in time (internal/renew: runtime timers, no goroutine).
func (h *Handle) start() {
	h.lease.Set(renew.Start(h.sent, renew.Config{
		TTL: h.tm.ttl, Drift: h.tm.drift,
		Renew: h.renew, Lost: h.leaseLost, Go: h.l.run,
	}))
}

// renew extends the lease on every node where the lock is still ours. It
// reports ok when a majority extended it; ok=false when so many nodes said
// it is not ours that no majority can be; an error otherwise (nodes that
// failed or did not answer), which internal/renew retries until the
// validity ends.
func (h *Handle) renew(ctx context.Context) (bool, error) {
	res, err := fanout(h.l, ctx, ctx, h.l.closing, h.l.all, h.tm.nodeTimeout,
		func(ctx context.Context, _ int, c goredis.UniversalClient) (bool, error) {
			return runExtend(ctx, c, h.k, h.owner, h.tm.ttl)
		}, nil, func(o outcome[bool]) bool { // a majority either way
			var yes []int
			no := 0
			for i := range h.l.clients {
				switch {
				case o.ok(i) && o.v[i]:
					yes = append(yes, i)
				case o.ok(i):
					no++
				}
			}
			return h.l.vet.distinct(yes) >= h.l.quorum || no >= len(h.l.clients)-h.l.quorum+1
		})
	if err != nil {
		return false, err
	}
	var extended, gone, failed []int
	for i := range h.l.clients {
		switch {
		case !res.ok(i):
			failed = append(failed, i)
		case res.v[i]:
			extended = append(extended, i)
		default:
			gone = append(gone, i)
		}
	}
	n, q := len(h.l.clients), h.l.quorum
	switch {
	case h.l.vet.distinct(extended) >= q:
		// One per server: a node the Locker has not vetted, or two names
		// of one server, do not make a majority (see vet.go).
		return true, nil
	case len(gone) >= n-q+1:
		return false, nil
	}
	counted := h.l.vet.distinct(extended)
	if len(failed) == 0 {
		// Every node answered, and some that extended do not count.
		return false, fmt.Errorf("renewal extended the lock on %d of %d nodes, but they are %d servers compared with each other (need %d): the rest answered for the first time or as another server, and count once an acquire has compared them; %d no longer held it",
			len(extended), n, counted, q, len(gone))
	}
	first := failed[0]
	return false, fmt.Errorf("renewal reached only %d of %d nodes (need %d); %d no longer held it; %s: %w",
		counted, n, q, len(gone), h.l.addrs[first], res.err[first])
}

// leaseLost is internal/renew's report of a loss.
func (h *Handle) leaseLost(cause error) {
	if errors.Is(cause, renew.ErrGone) {
		h.lose("a majority of the nodes no longer hold the lock: its lease ran out there, or it was deleted")
		return
	}
	h.lose(cause.Error())
}

func (h *Handle) lostErr(why string) error {
	return locker.KeyError("hold", h.key, fmt.Errorf("%w: %s", locker.ErrLost, why))
}

// lose ends the lock as lost and deletes it in the background on every
// node where it may still be ours, announcing it, so that it does not block
// others for the rest of its lease.
func (h *Handle) lose(why string) {
	if !h.end(h.lostErr(why)) {
		return
	}
	h.l.unregister(h)
	if !h.l.enter() {
		return
	}
	go func() {
		defer h.l.exit()
		_ = h.l.cleanup(context.Background(), h.k, h.owner, h.l.all, h.tm.nodeTimeout, true)
	}()
}

// end records how the lock ended and stops its renewal.
func (h *Handle) end(err error) bool {
	first := h.st.End(err)
	h.stopRenewal()
	return first
}

func (h *Handle) stopRenewal() { h.lease.Stop() }

// releaseCounts runs the owner-checked delete on every node, announcing it,
// and counts the answers. Its requests are not bound by ctx, which only
// bounds the wait.
func (h *Handle) releaseCounts(ctx context.Context) (deleted, notOurs int, failed []error, err error) {
	res, err := fanout(h.l, ctx, context.Background(), nil, h.l.all, h.tm.nodeTimeout,
		func(ctx context.Context, _ int, c goredis.UniversalClient) (bool, error) {
			return runRelease(ctx, c, h.k, h.owner)
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

// Release deletes the lock on every node where it is still ours (compare
// and delete, in parallel, each bounded by the node timeout), which wakes
// the nodes' waiters. It never deletes another holder's lock. It succeeds
// when a majority deleted it. When fewer could be reached the lock is given
// up all the same (renewal stops, Err reports locker.ErrReleased) and
// expires within its TTL on the nodes not reached; the error says so. When
// every node answered and fewer than a majority still held it, the lock had
// been lost and the error wraps locker.ErrLost.
func (h *Handle) Release(ctx context.Context) error {
	h.mu.Lock()
	if h.releasing || h.st.Ended() {
		h.mu.Unlock()
		return h.endedErr(ctx)
	}
	h.releasing = true
	h.mu.Unlock()
	if !h.l.enter() {
		return h.closeVerdict(ctx)
	}
	defer h.l.exit()
	h.l.unregister(h)
	// The validity may have ended without the loss reported yet (the
	// process was paused past it, and this ran first on resuming): then a
	// release that reaches no majority must report the loss.
	h.mu.Lock()
	expired := h.lease.Expired(time.Now())
	h.mu.Unlock()
	h.stopRenewal()
	deleted, notOurs, failed, err := h.releaseCounts(ctx)
	n, q := len(h.l.clients), h.l.quorum
	switch {
	case deleted >= q:
		if !h.end(locker.ErrReleased) {
			return h.endedErr(ctx)
		}
		return nil
	case expired && (err != nil || len(failed) > 0):
		cause := err
		if cause == nil {
			cause = errors.Join(failed...)
		}
		h.end(h.lostErr(fmt.Sprintf("its validity had ended before Release came, and the release reached only %d of %d nodes: %v", deleted, n, cause)))
		return h.endedErr(ctx)
	case err != nil || len(failed) > 0:
		if !h.end(locker.ErrReleased) {
			return h.endedErr(ctx)
		}
		cause := err
		if cause == nil {
			cause = errors.Join(failed...)
		}
		return locker.KeyError("release", h.key, fmt.Errorf("deleted on %d of %d nodes, %d no longer held it, %d failed or did not answer; the lock was given up and expires within its TTL of %v where it remains: %w",
			deleted, n, notOurs, len(failed), h.tm.ttl, cause))
	default:
		h.end(h.lostErr(fmt.Sprintf("the lock was no longer ours on %d of %d nodes when Release came: its lease had run out, or it was deleted", notOurs, n)))
		return h.endedErr(ctx)
	}
}

// releaseByClose is Close's release of a lock it still held.
func (h *Handle) releaseByClose(ctx context.Context) error {
	h.stopRenewal()
	deleted, notOurs, failed, err := h.releaseCounts(ctx)
	n, q := len(h.l.clients), h.l.quorum
	switch {
	case deleted >= q:
		h.end(locker.ErrReleasedByClose)
		return nil
	case err != nil || len(failed) > 0:
		cause := err
		if cause == nil {
			cause = errors.Join(failed...)
		}
		h.end(locker.KeyError("hold", h.key, fmt.Errorf("%w (%w): Close could not release the lock on a majority; it expires within its TTL of %v", locker.ErrLost, locker.ErrClosed, h.tm.ttl)))
		return locker.KeyError("release", h.key, fmt.Errorf("deleted on %d of %d nodes, %d failed or did not answer (the lock expires within its TTL): %w", deleted, n, len(failed), cause))
	default:
		_ = notOurs
		h.end(h.lostErr("released by Close, but a majority of the nodes no longer held it"))
		return nil
	}
}

// closeVerdict is what Release returns when the Locker's Close is
// releasing the lock: Close's verdict, as soon as it has one.
func (h *Handle) closeVerdict(ctx context.Context) error {
	t := time.NewTimer(locker.ReleaseTimeout + time.Second)
	defer t.Stop()
	select {
	case <-h.st.Done():
	case <-t.C:
		h.end(h.lostErr("the Locker closed before Release"))
	case <-ctx.Done():
		return locker.KeyError("release", h.key, fmt.Errorf("%w (the Locker is closing; Close releases the lock)", ctxErr(ctx)))
	}
	return h.endedErr(ctx)
}

// endedErr is Release's error on an ended (or ending) lock.
func (h *Handle) endedErr(ctx context.Context) error { return h.st.ReleaseError(ctx, h.key) }
