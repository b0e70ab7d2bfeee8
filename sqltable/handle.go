package sqltable

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/renew"
	"github.com/go-locker/locker/internal/timerq"
)

var _ locker.Handle = (*Handle)(nil)

// Handle is one held lock. It is safe for concurrent use.
type Handle struct {
	l     *Locker
	key   string
	owner string
	token int64
	ttl   time.Duration
	st    *backend.State
	lease renew.Slot

	bellState int           // see bell; guarded by the Locker's bell.stateMu
	bellEntry *timerq.Entry // rings the bell; guarded by bell.stateMu

	mu        sync.Mutex
	releasing bool // a Release or Close has claimed the lock
}

// Key returns the key as the caller gave it.
func (h *Handle) Key() string { return h.key }

// Token returns the fencing token: the row's token column after this
// acquisition set it (see "Fencing tokens" in the package documentation).
func (h *Handle) Token() int64 { return h.token }

// Owner returns the random owner string that this holder's row carries
// while the lock is held, which Release and renewal compare before they
// act. It is for operators and tests.
func (h *Handle) Owner() string { return h.owner }

// TTL returns the lease of the lock.
func (h *Handle) TTL() time.Duration { return h.ttl }

// Done is closed once the lock is released or lost.
func (h *Handle) Done() <-chan struct{} { h.lease.Check(); return h.st.Done() }

// Err is nil while the lock is held, then locker.ErrReleased or an error
// wrapping locker.ErrLost.
func (h *Handle) Err() error { h.lease.Check(); return h.st.Err() }

// start begins the lease: renewals every TTL/3 (unless the watchdog is off)
// and the loss timer at sent + TTL − drift on the local monotonic clock.
func (h *Handle) start(sent time.Time, drift time.Duration) {
	cfg := renew.Config{
		TTL:   h.ttl,
		Drift: drift,
		Lost:  h.lost,
		Go:    h.l.run,
	}
	if h.l.cfg.watchdog {
		cfg.Renew = h.renew
	}
	h.lease.Set(renew.Start(sent, cfg))
}

// renew extends the lease when the row still carries this holder's owner
// and token and its lease has not run out.
func (h *Handle) renew(ctx context.Context) (bool, error) {
	cctx, cancel := h.l.callCtx(ctx)
	defer cancel()
	var n int64
	err := h.l.retry(cctx, func(ctx context.Context) error {
		res, err := h.l.ps.renew.ExecContext(ctx, h.ttl.Microseconds(), h.key, h.owner, h.token)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return false, err
	}
	return n == 1, nil
}

// lost is the lease's verdict: no renewal succeeded in time, or one found
// the row no longer ours.
func (h *Handle) lost(cause error) {
	if !h.claim() {
		return // Release or Close is at work on it
	}
	h.st.End(h.lostErr(cause.Error()))
	h.l.unregister(h)
	h.l.bell.unring(h)
	// The row may still be ours (a renewal that succeeded too late, or a
	// database that was merely slow): free it so that it does not block
	// others for the rest of its lease.
	h.l.cleanup(h.key, h.owner, h.ttl)
}

func (h *Handle) lostErr(why string) error {
	return locker.KeyError("hold", h.key, fmt.Errorf("%w: %s", locker.ErrLost, why))
}

// claim marks the lock as being ended by the caller; false when another
// Release, Close or the loss timer got there first.
func (h *Handle) claim() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.releasing || h.st.Ended() {
		return false
	}
	h.releasing = true
	return true
}

// stop stops renewals and the loss timer.
func (h *Handle) stop() { h.lease.Stop() }

// Release frees the lock if this holder still has it, and wakes waiters.
// It never frees another holder's lock. After loss it returns an error
// wrapping locker.ErrLost; a second Release returns one wrapping
// locker.ErrReleased. When the database cannot be reached the lock is given
// up all the same (renewal stops, Err reports ErrReleased) and frees at the
// end of its lease, or earlier when a background retry reaches the
// database within min(TTL, 5s); the error says which. A Close that begins
// meanwhile waits for this Release at most locker.ReleaseTimeout, then cuts
// it short (the error then wraps locker.ErrClosed).
func (h *Handle) Release(ctx context.Context) error {
	ok, counted := h.l.claimRelease(h)
	if !ok {
		return h.endedErr(ctx)
	}
	if counted {
		defer h.l.wg.Done()
	}
	expired := h.lease.Expired(time.Now())
	h.stop()
	// Close, if it has begun, left this lock to us (we claimed it first);
	// the release is bounded by ctx and by Close's own bound.
	rctx, cancel := h.l.endCallCtx(ctx)
	defer cancel()
	freed, err := h.l.release(rctx, h)
	h.l.unregister(h)
	h.l.bell.unring(h)
	switch {
	case err != nil && expired:
		// The lease had run out before Release came (the holder was
		// paused past it?): the lock may have gone to another holder, and
		// the failed statement cannot say otherwise.
		h.l.cleanup(h.key, h.owner, h.ttl)
		h.st.End(h.lostErr(fmt.Sprintf("its lease had run out before Release came, and the release failed: %v", err)))
		return h.endedErr(ctx)
	case err != nil:
		h.st.End(locker.ErrReleased)
		if ctx.Err() == nil && h.l.endCtx.Err() != nil {
			return locker.KeyError("release", h.key, fmt.Errorf("%w: Close cut the release short after %v (%w); the lock was given up and frees at the end of its lease of %v", locker.ErrClosed, locker.ReleaseTimeout, err, h.ttl))
		}
		if h.l.cleanup(h.key, h.owner, h.ttl) {
			return locker.KeyError("release", h.key, fmt.Errorf("%w (the lock was given up; a background retry frees it if the database answers within %v, else it frees at the end of its lease of %v)", err, min(h.ttl, cleanupTimeout), h.ttl))
		}
		return locker.KeyError("release", h.key, fmt.Errorf("%w (the lock was given up; it frees at the end of its lease of %v)", err, h.ttl))
	case freed:
		h.st.End(locker.ErrReleased)
		return nil
	default:
		h.st.End(h.lostErr("the lock was no longer ours when Release came: its lease had run out, or the row was changed or deleted outside this Locker"))
		return h.endedErr(ctx)
	}
}

// endedErr is what Release returns on an ended (or ending) lock.
func (h *Handle) endedErr(ctx context.Context) error { return h.st.ReleaseError(ctx, h.key) }
