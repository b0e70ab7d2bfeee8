package sqltable

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/lease"
	"github.com/go-locker/locker/internal/timerq"
)

var _ locker.AtRisker = (*Handle)(nil)

var _ locker.Handle = (*Handle)(nil)

// Handle is one held lock. It is safe for concurrent use.
type Handle struct {
	l *Locker
	// The lock as the Locker made it; start hands them to c, which the
	// Handle's methods read.
	key   string
	owner string
	token int64 // the row's token, which the statements compare
	fence int64 // token plus the Locker's token base: Token
	ttl   time.Duration
	st    *backend.State
	// A lock family's row (families.go): its family (0 for a mutex, whose
	// row is the key's row of the lock table) and its place in the key's
	// queue.
	fam int
	seq int64
	c   lease.Handle // state, lease and the verdicts (internal/lease)
	// dequeued: a mutex lock taken by a queued waiter; closed once its
	// waiter row is deleted, which Release waits for (queue.go). nil if
	// it never queued.
	dequeued chan struct{}

	bellState int           // see bell; guarded by the Locker's bell.stateMu
	bellEntry *timerq.Entry // rings the bell; guarded by bell.stateMu
}

// bellKey names the lock's bell (MySQL, bell.go): the key of a mutex; a
// family's row, for its waiters to wait on (famBellKey).
func (h *Handle) bellKey() string {
	if h.fam != 0 {
		return famBellKey(h.fam, h.key, h.seq)
	}
	return h.key
}

// Key returns the key as the caller gave it.
func (h *Handle) Key() string { return h.c.Key }

// Token returns the fencing token: the row's token column after this
// acquisition set it, plus the Locker's token base (WithTokenBase; see
// "Fencing tokens" in the package documentation).
func (h *Handle) Token() int64 { return h.c.Token }

// Owner returns the random owner string that this holder's row carries
// while the lock is held, which Release and renewal compare before they
// act. It is for operators and tests.
func (h *Handle) Owner() string { return h.c.Owner }

// TTL returns the lease of the lock.
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

// start begins the lease: renewals every TTL/3 (unless the watchdog is off)
// and the loss timer at sent + TTL − drift on the local monotonic clock.
// Until then the Handle is not handed out: only Close (claim, stop, and
// the Handle's own fields) may touch it.
func (h *Handle) start(sent time.Time, drift time.Duration) {
	h.c.Init(h.key, h.owner, h.fence, h.ttl, h.st, lease.Proto{
		Ops: (*leaseOps)(h), Server: "the database", Gone: "the row was changed or deleted outside this Locker", Log: backend.Log{L: h.l.cfg.Logger},
	})
	h.c.Start(sent, !h.l.cfg.NoWatchdog, lease.RenewConfig{Drift: drift, Go: h.l.runFn})
}

// leaseOps is the Handle as its lease handle's protocol calls
// (lease.Ops): (*leaseOps)(h) is a pointer of another type, so it costs no
// allocation and adds no methods to Handle's own.
type leaseOps Handle

func (o *leaseOps) Release(ctx context.Context) (bool, error) { return (*Handle)(o).release(ctx) }
func (o *leaseOps) Cleanup() bool                             { return (*Handle)(o).cleanup() }
func (o *leaseOps) Forget()                                   { (*Handle)(o).forget() }
func (o *leaseOps) Enter() (bool, func())                     { return (*Handle)(o).enter() }
func (o *leaseOps) Renew(ctx context.Context) (bool, error)   { return (*Handle)(o).renew(ctx) }

// renew extends the lease when the row still carries this holder's owner
// and token and its lease has not run out: in a batch with the Locker's
// other renewals of one TTL and table that come due together (renewMany).
func (h *Handle) renew(ctx context.Context) (bool, error) {
	return h.l.renewals.Renew(ctx, renewGroup(h.ttl, h.fam != 0), h.ttl, h)
}

// renewOne is renew on its own statement.
func (h *Handle) renewOne(ctx context.Context) (bool, error) {
	cctx, cancel := h.l.callCtx(ctx)
	defer cancel()
	var n int64
	err := h.l.retryIdem(cctx, func(ctx context.Context) error {
		var res sql.Result
		var err error
		if h.fam != 0 {
			res, err = h.l.fps.renew.ExecContext(ctx, h.l.fst.renew.args(h.ttl.Microseconds(), h.fam, h.key, h.seq, h.owner, h.token)...)
		} else {
			res, err = h.l.ps.renew.ExecContext(ctx, h.ttl.Microseconds(), h.key, h.owner, h.token)
		}
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

// release is Release's guarded statement (lease.Ops.Release). Close, if
// it has begun, left this lock to the Release (which claimed it first); the
// statement is bounded by ctx and by Close's own bound.
func (h *Handle) release(ctx context.Context) (bool, error) {
	rctx, cancel := h.l.endCallCtx(ctx)
	defer cancel()
	freed, err := h.l.release(rctx, h)
	if err != nil && ctx.Err() == nil && h.l.endCtx.Err() != nil {
		return false, fmt.Errorf("%w: Close cut the release short after %v (%w)", locker.ErrClosed, locker.ReleaseTimeout, err)
	}
	return freed, err
}

// enter counts a Release as in flight for Close to wait for, until Close
// has begun waiting (lease.Ops.Enter). Close never takes over a Release:
// it leaves a lock that a Release claimed to it.
func (h *Handle) enter() (bool, func()) {
	if !h.l.life.Begin() {
		return true, func() {}
	}
	return true, h.l.endFn
}

// cleanup frees the row in the background if it still carries the owner
// (lease.Ops.Cleanup).
func (h *Handle) cleanup() bool {
	if h.fam != 0 {
		return h.l.famCleanup(h.fam, h.key, h.owner, h.ttl)
	}
	return h.l.cleanup(h.key, h.owner, h.ttl)
}

// forget drops the Handle from the Locker and its bell (lease.Ops.Forget).
func (h *Handle) forget() {
	h.l.unregister(h)
	h.l.bell.unring(h)
}

// lostErr, claim and stop are the Locker's (Close's, an acquire's) way to
// the lease handle (lease.LostErr, lease.Handle Claim and Stop); they work
// before start too.
func (h *Handle) lostErr(why string) error { return lease.LostErr(h.key, why) }
func (h *Handle) claim() bool              { return h.c.Claim() }
func (h *Handle) stop()                    { h.c.Stop() }

// Release frees the lock if this holder still has it, and wakes waiters.
// It never frees another holder's lock. After loss it returns an error
// wrapping locker.ErrLost; a second Release returns one wrapping
// locker.ErrReleased. When the database cannot be reached the lock is given
// up all the same (renewal stops, Err reports ErrReleased) and frees at the
// end of its lease, or earlier when a background retry reaches the
// database within min(TTL, 5s); the error says which. A Close that begins
// meanwhile waits for this Release at most locker.ReleaseTimeout, then cuts
// it short (the error then wraps locker.ErrClosed).
func (h *Handle) Release(ctx context.Context) error { return h.c.Release(ctx) }
