package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/renew"
)

var _ locker.Handle = (*Handle)(nil)

// Handle is one held lock. It is safe for concurrent use.
type Handle struct {
	l     *Locker
	key   string
	k     keys
	owner string
	token int64
	ttl   time.Duration
	drift time.Duration
	sent  time.Time // when the acquiring request left: the lease starts no earlier
	st    *backend.State
	lease renew.Slot // set by start

	mu        sync.Mutex
	releasing bool
}

func newHandle(l *Locker, key string, k keys, owner string, token int64, ttl, drift time.Duration, sent time.Time) *Handle {
	return &Handle{
		l: l, key: key, k: k, owner: owner, token: token, ttl: ttl, drift: drift, sent: sent,
		st: backend.NewState(),
	}
}

// Key returns the key as the caller gave it.
func (h *Handle) Key() string { return h.key }

// Token returns the fencing token: the value of the key's fence counter
// after this acquisition incremented it.
func (h *Handle) Token() int64 { return h.token }

// Owner returns the random owner token that this holder's lock carries in
// Redis: the value of the lock key (see Locker.KeyNames) while the lock is
// held, and what Release and renewal compare before they act. It is for
// operators and tests, to tell which holder a lock key belongs to. Whoever
// knows it can release or renew the lock on the server: log it only where
// the server's own credentials may be seen.
func (h *Handle) Owner() string { return h.owner }

// Done is closed once the lock is released or lost.
func (h *Handle) Done() <-chan struct{} { h.lease.Check(); return h.st.Done() }

// Err is nil while the lock is held, then locker.ErrReleased or an error
// wrapping locker.ErrLost.
func (h *Handle) Err() error { h.lease.Check(); return h.st.Err() }

// TTL returns the lease of the lock.
func (h *Handle) TTL() time.Duration { return h.ttl }

// start keeps the lease: the loss deadline always, the watchdog (renewal
// every TTL/3) if enabled. Both run on runtime timers (internal/renew), so a
// held lock costs no goroutine while it waits. It runs inside the acquiring
// call, which the Locker counts as active.
//
// The loss timer, not the watchdog, declares the loss: a renewal request may
// hang (a partition, a paused server) past the deadline, and the holder must
// hear of the loss before the server lets anyone else in.
func (h *Handle) start() {
	cfg := renew.Config{TTL: h.ttl, Drift: h.drift, Lost: h.leaseLost, Go: h.l.run}
	if h.l.cfg.watchdog {
		cfg.Renew = h.renew
	}
	h.lease.Set(renew.Start(h.sent, cfg))
}

// renew extends the lease once; ctx ends at the loss deadline.
func (h *Handle) renew(ctx context.Context) (bool, error) {
	var ok bool
	err := h.l.execBackground(ctx, func(ctx context.Context) error {
		var err error
		ok, err = h.l.runExtend(ctx, h.k, h.owner, h.ttl)
		return err
	})
	if err != nil {
		// An abandoned request may still write ok: do not read it.
		return false, err
	}
	return ok, nil
}

// leaseLost is the lease keeper's report of a loss.
func (h *Handle) leaseLost(cause error) {
	if !h.l.cfg.watchdog && errors.Is(cause, renew.ErrExpired) {
		h.lose("lease ran out (the watchdog is off)")
		return
	}
	h.lose(cause.Error())
}

func (h *Handle) lostErr(why string) error {
	return locker.KeyError("hold", h.key, fmt.Errorf("%w: %s", locker.ErrLost, why))
}

// lose ends the lock as lost, then deletes it in the background in case it
// is still ours on the server (a renewal that succeeded too late), so that
// it does not block others for the rest of its lease.
func (h *Handle) lose(why string) {
	if !h.end(h.lostErr(why)) {
		return
	}
	h.l.unregister(h)
	if h.l.enter() {
		h.l.cleanup(h.k, h.owner)
		h.l.exit()
	}
}

// end records how the lock ended and stops everything that kept it alive.
func (h *Handle) end(err error) bool {
	first := h.st.End(err)
	h.stopRenewal()
	return first
}

// stopRenewal stops the watchdog and the loss timer without waiting for
// them.
func (h *Handle) stopRenewal() { h.lease.Stop() }

// Release deletes the lock if it is still ours, and wakes waiters. It never
// deletes another holder's lock. After loss it returns an error wrapping
// locker.ErrLost; a second Release returns one wrapping locker.ErrReleased.
// When the server cannot be reached the lock is given up all the same
// (renewal stops, Err reports ErrReleased) and expires after its TTL; the
// error says so. Release returns when ctx ends, whatever the client does
// with contexts; a Release that another one of the same Handle is still
// performing waits for its verdict only as long as its own ctx allows.
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
	expired := h.lease.Expired(time.Now())
	h.stopRenewal()
	var released bool
	err := h.l.exec(ctx, func(ctx context.Context) error {
		var err error
		released, err = h.l.runRelease(ctx, h.k, h.owner)
		return err
	}, nil)
	if errors.Is(err, locker.ErrClosed) && ctx.Err() == nil {
		// Close began meanwhile and abandoned the request; the handle was
		// still registered, so Close releases the lock.
		return h.closeVerdict(ctx)
	}
	h.l.unregister(h)
	switch {
	case err != nil && expired:
		// The lease had run out before Release came (the holder was
		// paused past it?): the lock may have gone to another holder, and
		// the failed request cannot say otherwise.
		h.l.cleanup(h.k, h.owner)
		h.end(h.lostErr(fmt.Sprintf("its lease had run out before Release came, and the release failed: %v", err)))
		return h.endedErr(ctx)
	case err != nil:
		if !h.end(locker.ErrReleased) {
			return h.endedErr(ctx)
		}
		// Keep trying for a while in the background (ctx may merely have
		// been too short), so the key frees sooner than its TTL.
		h.l.cleanup(h.k, h.owner)
		return locker.KeyError("release", h.key, fmt.Errorf("%w (the lock was given up; it is deleted in the background if the server answers, else it expires within its TTL of %v)", err, h.ttl))
	case released:
		if !h.end(locker.ErrReleased) {
			// The loss timer fired while the release was in flight: the
			// holder was told it lost the lock, so say so here too.
			return h.endedErr(ctx)
		}
		return nil
	default:
		h.end(h.lostErr("the lock was no longer ours when Release came: its lease had run out, or it was deleted on the server"))
		return h.endedErr(ctx)
	}
}

// closeVerdict is what Release returns when the Locker's Close is releasing
// the lock: Close's verdict, once it has one.
func (h *Handle) closeVerdict(ctx context.Context) error {
	t := time.NewTimer(locker.ReleaseTimeout + time.Second)
	defer t.Stop()
	select {
	case <-h.st.Done():
	case <-t.C:
		// Close did not end the handle (it was not among the held ones):
		// give it up here.
		h.end(h.lostErr("the Locker closed before Release"))
	case <-ctx.Done():
		return locker.KeyError("release", h.key, fmt.Errorf("%w (the Locker is closing; Close releases the lock)", ctxErr(ctx)))
	}
	return h.endedErr(ctx)
}

// endedErr is what Release returns on an ended (or ending) lock: an error
// with op "release" and the key, wrapping locker.ErrReleased (also
// locker.ErrClosed after Close) or locker.ErrLost. A concurrent Release may
// still be at work on the lock; endedErr waits for it as long as ctx allows.
func (h *Handle) endedErr(ctx context.Context) error { return h.st.ReleaseError(ctx, h.key) }
