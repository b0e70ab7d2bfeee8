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

// monitorDelay is how long after a grant the monitor starts.
const monitorDelay = 10 * time.Millisecond

// monitor watches a held lock's connection until the lock is released or
// lost. It alternates two phases:
//
//   - idle: it waits on the socket for one interval. A healthy idle session
//     sends nothing, so anything that arrives — the FATAL message of
//     pg_terminate_backend or of a server shutdown, an EOF, a reset — means
//     the session ended, and the loss is reported at once, not at the next
//     check.
//   - check: it asks the server which backend answers and whether that
//     backend still holds the lock. No answer within one interval (a
//     partition, a frozen server), an error, another backend (a
//     transaction-mode pooler) or a missing lock ends the handle with
//     locker.ErrLost.
//
// On loss the connection is closed, never handed back: if the server still
// thinks the session alive, the close is what frees the lock for others.
//
// The monitor starts monitorDelay after the grant. Most holds are short, and
// a monitor that must be woken from its socket wait costs a release two
// goroutine switches; a session that ends within the delay is still noticed
// the moment the monitor starts and finds the socket closed.
func (h *handle) monitor() {
	defer close(h.exited)
	nc := h.pgc.Conn()
	interval := h.l.cfg.interval
	for {
		h.mmu.Lock()
		if h.stopping {
			h.mmu.Unlock()
			return
		}
		h.idle = true
		_ = nc.SetReadDeadline(time.Now().Add(interval))
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
		if err := h.check(interval); err != nil {
			if errors.Is(err, ErrPooler) {
				unstrand(h.conn, h.id, h.pid)
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
			close(h.exited) // Close is over: so is the hold
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

// check runs one health check with a deadline of one interval.
func (h *handle) check(interval time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), interval)
	defer cancel()
	// pgx reacts to the deadline according to the pool's configuration; a
	// pool set up to send cancel requests could wait much longer on a dead
	// link. Closing the socket bounds the check whatever the configuration.
	backstop := time.AfterFunc(interval+cancelGrace, func() { _ = h.pgc.Conn().Close() })
	defer backstop.Stop()
	hi, lo := keyHalves(h.id)
	var pid int32
	var held bool
	if err := h.conn.QueryRow(ctx, sqlHeld, hi, lo).Scan(&pid, &held); err != nil {
		return fmt.Errorf("health check failed: %w", err)
	}
	if uint32(pid) != h.pid {
		return fmt.Errorf("%w: health check answered by server backend %d, but backend %d was granted the lock", ErrPooler, pid, h.pid)
	}
	if !held {
		return errors.New("the session no longer holds the lock (pg_advisory_unlock_all, DISCARD ALL or an unlock on the session?)")
	}
	return nil
}

// lose ends the handle with ErrLost and closes its connection. Only the first
// ending counts: a Release that already ended the handle keeps its result.
func (h *handle) lose(cause error) {
	h.state.End(backend.KeyError("hold", h.key, fmt.Errorf("%w: %w", locker.ErrLost, cause)))
	h.discard()
}

func isTimeout(err error) bool {
	if pgconn.Timeout(err) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
