package redis

import (
	"context"
	"errors"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/lease"
)

var _ locker.AtRisker = (*Handle)(nil)

var _ locker.Handle = (*Handle)(nil)

// Handle is one held lock. It is safe for concurrent use.
type Handle struct {
	l     *Locker
	k     keys
	key   string // c.Key and c.Owner, for the Locker's Close
	owner string
	oarg  any // owner as a script argument (see evalsha), the attempt's (attempt.oarg)
	drift time.Duration
	sent  time.Time    // when the acquiring request left: the lease starts no earlier
	c     lease.Handle // identity, state, lease and the verdicts (internal/lease)
}

// newHandle makes the Handle of an acquisition; oarg is the owner as the
// attempt's requests passed it (attempt.oarg), nil for the owner
// itself.
func newHandle(l *Locker, key string, k keys, owner string, oarg any, token int64, ttl, drift time.Duration, sent time.Time) *Handle {
	if oarg == nil {
		oarg = owner
	}
	h := &Handle{l: l, k: k, key: key, owner: owner, oarg: oarg, drift: drift, sent: sent}
	h.c.Init(key, owner, token, ttl, backend.NewState(), lease.Proto{
		Ops: (*leaseOps)(h), Server: "the server", Gone: "it was deleted on the server", Log: backend.Log{L: l.cfg.Logger},
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

// Token returns the fencing token: the value of the key's fence counter
// (the family's counter of the key, for a permit, read or write lock)
// after this acquisition incremented it, plus the Locker's token base
// (WithTokenBase).
func (h *Handle) Token() int64 { return h.c.Token }

// Owner returns the owner token that this holder's lock carries in Redis:
// the value of the lock key (see Locker.KeyNames) while the lock is held,
// and what Release and renewal compare before they act. It is random,
// followed by a space and the locker.WithOwner description when the lock
// was taken with one. (For a
// permit, read lock or write lock: its field in the key's holders hash and
// its member in the leases set, starting with 'p', 'r' or 'w'; see "Lock
// families" in the package documentation.) It is for
// operators and tests, to tell which holder a lock key belongs to. Whoever
// knows it can release or renew the lock on the server: log it only where
// the server's own credentials may be seen.
func (h *Handle) Owner() string { return h.c.Owner }

// Done is closed once the lock is released or lost.
func (h *Handle) Done() <-chan struct{} { return h.c.Done() }

// Err is nil while the lock is held, then locker.ErrReleased or an error
// wrapping locker.ErrLost.
func (h *Handle) Err() error { return h.c.Err() }

// AtRisk is locker.AtRisker's: at risk from a renewal that failed (it is
// retried) until one succeeds; the lock is lost if none does before its
// lease runs out.
func (h *Handle) AtRisk() (bool, <-chan struct{}) { return h.c.AtRisk() }

// TTL returns the lease of the lock.
func (h *Handle) TTL() time.Duration { return h.c.TTL }

// start keeps the lease: the loss deadline always, the watchdog (renewal
// every TTL/3) if enabled. Both run on runtime timers (internal/lease), so a
// held lock costs no goroutine while it waits. It runs inside the acquiring
// call, which the Locker counts as active.
func (h *Handle) start() {
	h.c.Start(h.sent, !h.l.cfg.NoWatchdog, lease.RenewConfig{Drift: h.drift, Go: h.l.runFn})
}

// renew extends the lease once; ctx ends at the loss deadline. It goes
// out in a batch with the Locker's other renewals of its TTL that come due
// within a moment (lease.Batcher, renewMany); on a Cluster, or on a server
// that refused keys of several slots in one script, with those of its hash
// slot.
func (h *Handle) renew(ctx context.Context) (bool, error) {
	group := uint64(h.c.TTL.Milliseconds())
	if h.l.sharded || h.l.slotBatches.Load() {
		group |= uint64(clusterSlot(h.k.lock)) << 48 // slots < 2^14, TTLs < 2^48 ms
	}
	return h.l.renewals.Renew(ctx, group, h.c.TTL, h)
}

// renewOne is renew on its own, outside a batch.
func (h *Handle) renewOne(ctx context.Context) (bool, error) {
	var ok bool
	err := h.l.execBackground(ctx, func(ctx context.Context) error {
		var err error
		ok, err = h.l.runExtend(ctx, h.k, h.owner, h.c.TTL)
		return err
	})
	if err != nil {
		// An abandoned request may still write ok: do not read it.
		return false, err
	}
	return ok, nil
}

// release is the owner-checked delete of Release (lease.Ops.Release).
func (h *Handle) release(ctx context.Context) (bool, error) {
	var released bool
	err := h.l.exec(ctx, func(ctx context.Context) error {
		var err error
		released, err = h.l.runRelease(ctx, &h.k, h.oarg)
		return err
	}, nil)
	switch {
	case errors.Is(err, locker.ErrClosed) && ctx.Err() == nil:
		// Close began meanwhile and abandoned the request; the handle is
		// still registered, so Close releases the lock.
		return false, lease.ErrToClose
	case err != nil:
		return false, err // an abandoned request may still write released
	}
	return released, nil
}

// cleanup deletes the lock in the background if it is still ours
// (lease.Ops.Cleanup), unless the Locker is closing.
func (h *Handle) cleanup() bool {
	if !h.l.enter() {
		return false
	}
	defer h.l.exit()
	h.l.cleanup(h.k, h.owner)
	return true
}

// lostErr, end and stopRenewal are the Locker's Close's way to the lease
// handle (lease.Handle LostErr, End and Stop).
func (h *Handle) lostErr(why string) error { return h.c.LostErr(why) }
func (h *Handle) end(err error) bool       { return h.c.End(err) }
func (h *Handle) stopRenewal()             { h.c.Stop() }

// Release deletes the lock if it is still ours, and wakes waiters. It never
// deletes another holder's lock. After loss it returns an error wrapping
// locker.ErrLost; a second Release returns one wrapping locker.ErrReleased.
// When the server cannot be reached the lock is given up all the same
// (renewal stops, Err reports ErrReleased) and expires after its TTL; the
// error says so. Release returns when ctx ends, whatever the client does
// with contexts; a Release that another one of the same Handle is still
// performing waits for its verdict only as long as its own ctx allows.
func (h *Handle) Release(ctx context.Context) error { return h.c.Release(ctx) }
