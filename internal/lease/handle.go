package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// Handle is the part of a lease-based backend's Handle that is the same on
// every such backend (redis, redis/redlock, sqltable), written once: the
// lock's identity (key, owner, token, TTL), its end-of-life state, its lease
// (renewal and loss timing: Renewal, renewal.go), and the three verdicts that end
// it: Release's, the loss's and Close's. The backend gives its protocol
// calls in Proto and keeps only those.
//
// A backend's Handle holds a Handle by value, sets it up with Init and
// forwards its Done, Err and Release to it. Claim also works on the zero
// value, for a Close that takes the lock over before Init. The fields are
// set by Init only.
type Handle struct {
	Key   string        // as the caller gave it
	Owner string        // the random owner token the lock carries on the server
	Token int64         // the fencing token
	TTL   time.Duration // the lease the server grants
	State *backend.State
	Proto Proto

	lease     Slot
	risk      backend.Risk // AtRisk: a renewal failed and none has succeeded since
	watchdog  bool         // the lease is renewed (Config.Renew was set)
	mu        sync.Mutex
	releasing bool // a Release, Close or the loss has claimed the lock
}

// Proto is what a lease handle needs from its backend: its protocol calls
// (Ops) and the words and logger of its messages.
type Proto struct {
	// Ops makes the protocol calls.
	Ops Ops
	// Server names what answers Release in messages: "the server", "the
	// database", "the nodes".
	Server string
	// Gone completes "its lease had run out, or ..." in the messages of a
	// lock found no longer ours: "it was deleted on the server".
	Gone string
	// Log is the Locker's logger (WithLogger): renewal failures, the
	// lock at risk and cleared, and its loss with the cause.
	Log backend.Log
}

// Ops is a lease handle's protocol calls, made by its backend. A
// backend's Handle gives itself converted to an unexported type of the
// same layout (type leaseOps Handle; (*leaseOps)(h)), which costs no
// allocation (an interface of a pointer) and adds no methods to the
// Handle users see; until December 2026 these were four func fields,
// method values made on every acquisition (issue 32).
type Ops interface {
	// Release gives the lock up on the server if it still carries the
	// owner (never another holder's lock), bounded by ctx. It reports
	// ours=true when it did, ours=false with a nil error when the lock was
	// no longer ours, and an error when it could not tell (the server
	// could not be reached, ctx ended). An error wrapping ErrToClose says
	// that Close began and releases the lock itself; one wrapping
	// locker.ErrClosed, that Close cut the release short.
	Release(ctx context.Context) (ours bool, err error)
	// Cleanup gives the lock up in the background, in case it is still
	// ours on the server, after a loss or a release that failed, so that
	// it does not block others for the rest of its lease. It reports
	// whether it started (false once the Locker is closing, or when the
	// backend has none).
	Cleanup() bool
	// Forget drops the handle from its Locker, which then no longer
	// releases it on Close. It may be called more than once.
	Forget()
	// Enter counts a Release as in progress, so that Close waits for it,
	// and runs exit when it ends. admitted=false says that Close has begun
	// and releases the lock itself: Release then waits for Close's
	// verdict.
	Enter() (admitted bool, exit func())
	// Renew extends the lease on the server (RenewConfig.Renew's
	// contract), when Start's config asks for the watchdog.
	Renew(ctx context.Context) (ok bool, err error)
}

// Init sets the lock's identity, state and protocol up, before the lease
// starts (Start) and the handle is handed out.
func (h *Handle) Init(key, owner string, token int64, ttl time.Duration, st *backend.State, p Proto) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Key, h.Owner, h.Token, h.TTL, h.State, h.Proto = key, owner, token, ttl, st, p
}

// Counted is an Ops.Enter from a Locker's own count of calls in progress:
// enter counts one and reports true, or reports false once Close has begun;
// exit ends one that enter counted.
func Counted(enter func() bool, exit func()) func() (bool, func()) {
	return func() (bool, func()) {
		if !enter() {
			return false, func() {}
		}
		return true, exit
	}
}

// ErrToClose is returned by an Ops.Release whose Locker's Close began
// while it was at work and abandoned it: Close, which still holds the
// handle, releases the lock, and Release reports Close's verdict.
var ErrToClose = errors.New("lease: Close releases the lock")

// LostErr is the error of a lock on key that was lost for the reason why:
// op "hold", wrapping locker.ErrLost.
func LostErr(key, why string) error {
	return backend.KeyError("hold", key, fmt.Errorf("%w: %s", locker.ErrLost, why))
}

// LostErr is the error of this lock lost for the reason why.
func (h *Handle) LostErr(why string) error { return LostErr(h.Key, why) }

// Start keeps the lease whose acquiring request was sent at sent: cfg
// without TTL, Lost, Failed, Renewed and Renew, which Start fills in (the
// loss ends the handle, see Lose; the watchdog, when watchdog is true,
// renews through Proto.Ops). A handle that has ended already (Close took it
// over before its lease started) keeps no lease: it is stopped at once.
func (h *Handle) Start(sent time.Time, watchdog bool, cfg RenewConfig) {
	cfg.TTL, cfg.events, cfg.Renew, cfg.renewer = h.TTL, h, nil, nil
	if watchdog {
		cfg.renewer = h.Proto.Ops
	}
	h.watchdog = watchdog
	h.lease.Set(StartRenewal(sent, cfg))
	if h.State.Ended() {
		h.lease.Stop()
	}
}

// AtRisk is the backend Handle's AtRisk (locker.AtRisker): at risk from
// a renewal that failed until one succeeds.
func (h *Handle) AtRisk() (bool, <-chan struct{}) { return h.risk.AtRisk() }

// renewFailed is the lease's report of a failed renewal, to be retried.
func (h *Handle) renewFailed(err error) {
	if h.State.Ended() {
		return
	}
	if h.risk.Set(true) {
		h.Proto.Log.Warn("locker: lock at risk: renewal failed, retrying", backend.LogKey(h.Key), backend.Err(err), slog.Duration("ttl", h.TTL))
		return
	}
	h.Proto.Log.Debug("locker: renewal failed again, retrying", backend.LogKey(h.Key), backend.Err(err))
}

// renewed is the lease's report of a successful renewal.
func (h *Handle) renewed() {
	if !h.State.Ended() && h.risk.Set(false) {
		h.Proto.Log.Info("locker: lock no longer at risk: renewal succeeded", backend.LogKey(h.Key))
	}
}

// Lease is the lease kept by Start; nil before.
func (h *Handle) Lease() *Renewal { return h.lease.Get() }

// Done is the backend Handle's Done: closed once the lock is released or
// lost, also when the lease's deadline has passed and its timer has not
// had its turn yet (see Renewal.Check).
func (h *Handle) Done() <-chan struct{} { h.lease.Check(); return h.State.Done() }

// Err is the backend Handle's Err: nil while the lock is held, then
// locker.ErrReleased or an error wrapping locker.ErrLost; checked against
// the lease's deadline as Done is.
func (h *Handle) Err() error { h.lease.Check(); return h.State.Err() }

// Claim marks the lock as being ended by the caller (a Release, Close or
// the loss); false when another got there first, or it has ended. Only
// the claimer ends the lock, except for a Close that takes every held
// handle over without claiming it.
func (h *Handle) Claim() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.releasing || h.State != nil && h.State.Ended() {
		return false
	}
	h.releasing = true
	return true
}

// Claimed reports whether the lock has been claimed (for tests).
func (h *Handle) Claimed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.releasing
}

// Stop stops the lease's renewals and its loss timer, without waiting.
func (h *Handle) Stop() { h.lease.Stop() }

// End records how the lock ended and stops its lease; it reports whether
// this call was the first (see backend.State.End).
func (h *Handle) End(err error) bool {
	first := h.State.End(err)
	h.lease.Stop()
	if first && errors.Is(err, locker.ErrLost) {
		h.Proto.Log.Warn("locker: lock lost", backend.LogKey(h.Key), backend.Err(err))
	}
	return first
}

// leaseLost is the lease's report of a loss (RenewConfig.Lost).
func (h *Handle) leaseLost(cause error) {
	switch {
	case errors.Is(cause, ErrGone):
		h.Lose("renewal found the lock no longer ours: its lease had run out, or " + h.Proto.Gone)
	case !h.watchdog && errors.Is(cause, ErrExpired):
		h.Lose("its lease ran out (the watchdog is off)")
	default:
		h.Lose(cause.Error())
	}
}

// Lose ends the lock as lost for the reason why, unless a Release or Close
// has claimed it (that one gives the verdict, from the server's answer),
// forgets it, and cleans it up in case it is still ours on the server (a
// renewal that succeeded too late, a server that was merely slow).
func (h *Handle) Lose(why string) {
	if !h.Claim() {
		return
	}
	h.End(h.LostErr(why))
	h.forget()
	h.cleanup()
}

func (h *Handle) forget() { h.Proto.Ops.Forget() }

func (h *Handle) cleanup() bool { return h.Proto.Ops.Cleanup() }

// Release is the backend Handle's Release: it gives the lock up on the
// server if it is still ours and tells which of four things happened.
//   - Released by us: nil; Err reports locker.ErrReleased.
//   - No longer ours on the server (lost): an error wrapping locker.ErrLost.
//   - Already ended, or ending: the error it ended with (ErrReleased for a
//     second Release, ErrLost after a loss, ErrClosed after Close), once a
//     Release at work on it has its verdict, as long as ctx allows.
//   - Could not tell (ctx ended, the server unreachable): the lock is given
//     up all the same (renewal stops, Err reports ErrReleased), cleaned up
//     in the background if it can be, and the error says that it expires
//     within its TTL; if the lease's deadline had passed before Release
//     came, the lock may have gone to another holder: a loss.
func (h *Handle) Release(ctx context.Context) error {
	admitted, exit := h.Proto.Ops.Enter()
	if !h.Claim() {
		exit()
		return h.EndedErr(ctx)
	}
	defer exit()
	if !admitted {
		return h.closeVerdict(ctx)
	}
	// The deadline may have passed without the loss reported yet (the
	// process was paused past it, and this ran first on resuming).
	expired := h.lease.Expired(time.Now())
	h.lease.Stop()
	ours, err := h.Proto.Ops.Release(ctx)
	if errors.Is(err, ErrToClose) {
		return h.closeVerdict(ctx)
	}
	h.forget()
	switch {
	case err != nil && expired:
		h.cleanup()
		h.End(h.LostErr(fmt.Sprintf("its lease had run out before Release came, and the release failed: %v", err)))
		return h.EndedErr(ctx)
	case err != nil:
		if !h.End(locker.ErrReleased) {
			return h.EndedErr(ctx)
		}
		then := fmt.Sprintf("it expires within its TTL of %v", h.TTL)
		// No clean-up once Close has cut the release short: the Locker
		// is shutting down.
		if !errors.Is(err, locker.ErrClosed) && h.cleanup() {
			then = fmt.Sprintf("it is deleted in the background if %s answers, else %s", h.Proto.Server, then)
		}
		return backend.KeyError("release", h.Key, fmt.Errorf("%w (the lock was given up; %s)", err, then))
	case ours:
		if !h.End(locker.ErrReleased) {
			// Close ended it meanwhile: say what the holder was told.
			return h.EndedErr(ctx)
		}
		return nil
	default:
		h.End(h.LostErr("the lock was no longer ours when Release came: its lease had run out, or " + h.Proto.Gone))
		return h.EndedErr(ctx)
	}
}

// Closed ends the lock with the verdict of Close's release of it (what
// Ops.Release found, run by Close) and returns the error Close reports
// for it: released, locker.ErrReleasedByClose and nil; no longer ours, a
// loss and nil; could not tell, a loss that also wraps locker.ErrClosed
// (the lock stays on the server until its lease ends) and an error saying
// so.
func (h *Handle) Closed(ours bool, err error) error {
	switch {
	case err != nil:
		h.End(backend.KeyError("hold", h.Key, fmt.Errorf("%w (%w): Close could not release the lock (%v); it expires within its TTL of %v", locker.ErrLost, locker.ErrClosed, err, h.TTL)))
		return backend.KeyError("release", h.Key, fmt.Errorf("%w (the lock expires within its TTL of %v)", err, h.TTL))
	case ours:
		h.End(locker.ErrReleasedByClose)
	default:
		h.End(h.LostErr("released by Close, but it was no longer ours: its lease had run out, or " + h.Proto.Gone))
	}
	return nil
}

// closeVerdict is what Release returns when the Locker's Close is
// releasing the lock: Close's verdict, as soon as it has one.
func (h *Handle) closeVerdict(ctx context.Context) error {
	t := time.NewTimer(locker.ReleaseTimeout + time.Second)
	defer t.Stop()
	select {
	case <-h.State.Done():
	case <-t.C:
		// Close did not end the handle (it was not among the held ones):
		// give it up here.
		h.End(h.LostErr("the Locker closed before Release"))
	case <-ctx.Done():
		return backend.KeyError("release", h.Key, fmt.Errorf("%w (the Locker is closing; Close releases the lock)", backend.ContextError(ctx)))
	}
	return h.EndedErr(ctx)
}

// EndedErr is what Release returns on an ended (or ending) lock (see
// backend.State.ReleaseError): op "release" and the key, wrapping what the
// lock ended with; a Release still at work on it is waited for as long as
// ctx allows.
func (h *Handle) EndedErr(ctx context.Context) error { return h.State.ReleaseError(ctx, h.Key) }
