package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// monitorDelay is how long after a grant the monitor starts: at once (on
// the Locker's timer queue, so that a Release that comes first stops it
// before it runs). It was 10ms, to spare short holds the monitor's wake-up
// at Release; but a session that ended within those 10ms (a connection
// reset right after the grant) went unnoticed while the server had freed
// the lock, and another client took it first, in a quarter of the runs of
// the conformance case Loss/ConnectionsReset: the loss must be reported no
// later than another client can acquire.
const monitorDelay = 0

// monitor watches a held lock's connection until the lock is released or
// lost. It alternates two phases:
//
//   - idle: it waits on the socket until one period (terms.period: the
//     health-check interval, or a third of the lease if shorter) after the
//     last answered statement was sent. A healthy idle session sends
//     nothing, so anything that arrives — the FATAL message of
//     pg_terminate_backend, of a server shutdown or of the session's
//     idle_session_timeout, an EOF, a reset — means the session ended, and
//     the loss is reported at once, not at the next check.
//   - check: it asks the server which backend answers and whether that
//     backend still holds the lock, which also starts the server's idle
//     timer (the lease) again. No answer within one interval, or by the
//     lease's deadline (the last answered statement's send time + lease −
//     drift margin) if that comes first (a partition, a frozen server), an
//     error, another backend (a transaction-mode pooler) or a missing lock
//     ends the handle with locker.ErrLost. The server cannot have ended
//     the session by its idle_session_timeout before the deadline: it
//     started the timer when it had answered, after the statement was sent.
//
// On loss the connection is closed, never handed back: if the server still
// thinks the session alive, the close is what frees the lock for others.
//
// The monitor starts right after the grant (monitorDelay): a session that
// ends before it waits on the socket is noticed the moment it starts and
// finds the socket closed.
func (h *handle) monitor() {
	defer close(h.exited)
	nc := h.pgc.Conn()
	for {
		h.mmu.Lock()
		if h.stopping {
			h.mmu.Unlock()
			return
		}
		h.idle = true
		_ = nc.SetReadDeadline(h.renewedAt().Add(h.terms.period))
		h.mmu.Unlock()

		// With context.Background, pgconn watches no context: the read
		// deadline set above (or by stopMonitor) is what ends the wait, and
		// a timeout leaves the connection usable.
		err := h.pgc.WaitForNotification(context.Background())

		h.mmu.Lock()
		h.idle = false
		_ = nc.SetReadDeadline(time.Time{})
		stopping := h.stopping
		h.mmu.Unlock()

		switch {
		case err == nil:
			continue // a NOTIFY for this session: harmless
		case !isTimeout(err):
			h.lose(fmt.Errorf("the connection to the server ended: %w", err))
			return
		case stopping:
			return
		}
		if err := h.check(); err != nil {
			if errors.Is(err, ErrPooler) {
				h.unstrand()
			}
			h.lose(err)
			return
		}
	}
}

// scheduleMonitor starts the monitor, in a goroutine of the Locker's Life,
// monitorDelay from now.
func (h *handle) scheduleMonitor() {
	h.mmu.Lock()
	defer h.mmu.Unlock()
	h.startTimer = h.l.monitorQ.Add(func() {
		if !h.l.life.Go(h.monitor) {
			// Close is over: so is the hold. A handle that lookAtClock
			// ended meanwhile, which Close's release left alone, needs
			// its connection closed: the monitor that would have done it
			// never runs.
			lost := h.state.Ended()
			close(h.exited)
			if lost {
				h.discard()
			}
		}
	})
}

// stopMonitor asks the monitor to return, waking it if it waits on the
// socket. A check in progress is left to finish.
func (h *handle) stopMonitor() {
	h.mmu.Lock()
	defer h.mmu.Unlock()
	if h.stopping {
		return
	}
	h.stopping = true
	switch {
	case h.startTimer.Stop():
		// The monitor never started, and now never will.
		close(h.exited)
	case h.idle:
		_ = h.pgc.Conn().SetReadDeadline(time.Now())
	}
}

// check runs one health check, with a deadline of one interval or the
// lease's deadline, whichever comes first; an answered check renews the
// lease from the moment it was sent.
func (h *handle) check() error {
	sent := time.Now()
	renewed := h.renewedAt()
	deadline := h.deadline()
	if !sent.Before(deadline) {
		// The monitor ran late (a stalled process): the server may have
		// ended the session already.
		return h.expired(renewed)
	}
	end := sent.Add(h.l.cfg.interval)
	// pgx reacts to the context's deadline according to the pool's
	// configuration; a pool set up to send cancel requests could wait much
	// longer on a dead link. Closing the socket bounds the check whatever
	// the configuration: a grace after the interval, or at the lease's
	// deadline.
	closeAt := end.Add(cancelGrace)
	byLease := !end.Before(deadline)
	if byLease {
		end, closeAt = deadline, deadline
	}
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	// A check that has not answered half way to its end (a partition, a
	// stalled server) puts the lock at risk: it is lost at the end.
	h.riskMu.Lock()
	h.checking++
	seq := h.checking
	h.riskMu.Unlock()
	slow := time.AfterFunc(end.Sub(sent)/2, func() {
		h.riskMu.Lock()
		defer h.riskMu.Unlock()
		if h.checking == seq { // this check is still at work
			h.atRisk(fmt.Errorf("health check has not answered in %v", time.Since(sent).Round(time.Millisecond)))
		}
	})
	defer func() {
		slow.Stop()
		h.riskMu.Lock()
		h.checking++ // a slow report of this check, running late, is void
		h.riskMu.Unlock()
	}()
	backstop := time.AfterFunc(time.Until(closeAt), func() { _ = h.pgc.Conn().Close() })
	defer backstop.Stop()
	hi, lo := keyHalves(h.id)
	var pid int32
	var held bool
	if err := h.conn.QueryRow(ctx, sqlHeld, hi, lo).Scan(&pid, &held); err != nil {
		if byLease && !time.Now().Before(deadline) {
			return fmt.Errorf("health check failed: %w (%w)", h.expired(renewed), err)
		}
		return fmt.Errorf("health check failed: %w", err)
	}
	if uint32(pid) != h.pid {
		return fmt.Errorf("%w: health check answered by server backend %d, but backend %d was granted the lock", ErrPooler, pid, h.pid)
	}
	if !held {
		return errors.New("the session no longer holds the lock (pg_advisory_unlock_all, DISCARD ALL or an unlock on the session?)")
	}
	h.renewed.Store(int64(sent.Sub(h.granted)))
	h.riskMu.Lock()
	h.checking++ // a slow report of this check, running late, is void
	h.cleared()
	h.riskMu.Unlock()
	return nil
}

// atRisk records that the lock is at risk for the reason err.
func (h *handle) atRisk(err error) {
	if !h.state.Ended() && h.risk.Set(true) {
		backend.Log{L: h.l.cfg.Logger}.Warn("locker: lock at risk", backend.LogKey(h.key), backend.Err(err))
	}
}

// cleared records that a health check answered: the lock is no longer at
// risk.
func (h *handle) cleared() {
	if !h.state.Ended() && h.risk.Set(false) {
		backend.Log{L: h.l.cfg.Logger}.Info("locker: lock no longer at risk: health check answered", backend.LogKey(h.key))
	}
}

// AtRisk is locker.AtRisker's: at risk while a health check of the
// lock's connection has not answered for half of the time it is given (a
// partition, a stalled server), until one answers; the lock is lost when
// the check fails or runs out of time.
func (h *handle) AtRisk() (bool, <-chan struct{}) { return h.risk.AtRisk() }

// lose ends the handle with ErrLost and closes its connection. Only the first
// ending counts: a Release that already ended the handle keeps its result.
func (h *handle) lose(cause error) {
	if err := lostErr(h.key, cause); h.state.End(err) {
		backend.Log{L: h.l.cfg.Logger}.Warn("locker: lock lost", backend.LogKey(h.key), backend.Err(err))
	}
	h.discard()
}

func lostErr(key string, cause error) error {
	return backend.KeyError("hold", key, fmt.Errorf("%w: %w", locker.ErrLost, cause))
}

// renewedAt is when the last statement the server answered was sent.
func (h *handle) renewedAt() time.Time {
	return h.granted.Add(time.Duration(h.renewed.Load()))
}

// deadline is until when the lock is surely held: the server cannot have
// ended the silent session before (see ttl.go).
func (h *handle) deadline() time.Time {
	return h.renewedAt().Add(h.terms.lease - h.terms.drift)
}

// lookAtClock ends the handle as lost, on the caller's goroutine, when its
// deadline has passed while it still counts as held: a holder that looks
// at its lock after a pause past the deadline (a GC pause, a stopped
// process, a suspended VM), before the monitor has had its turn to run, is
// told at its first look, as on the lease backends (lease.Renewal.Check).
// The session may be gone on the server, and the lock held by another. It
// closes the socket under the monitor, which then discards the connection
// (the monitor owns it, so this goroutine does no more than that). It
// costs a clock reading while the lock is held. A Release in progress
// (which holds relMu) settles the handle itself: closing the socket under
// it could hand a closed connection back to the pool.
func (h *handle) lookAtClock() {
	if h.state.Ended() {
		return
	}
	renewed := h.renewedAt()
	if time.Now().Before(renewed.Add(h.terms.lease - h.terms.drift)) {
		return
	}
	if !h.relMu.TryLock() {
		return
	}
	defer h.relMu.Unlock()
	if h.state.End(lostErr(h.key, h.expired(renewed))) {
		_ = h.pgc.Conn().Close()
	}
}

func isTimeout(err error) bool {
	if pgconn.Timeout(err) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
