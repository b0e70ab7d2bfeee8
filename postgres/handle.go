package postgres

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/timerq"
)

// errNotAcquired is what TryAcquire reports when another session holds the key.
var errNotAcquired = fmt.Errorf("%w: another session holds it", locker.ErrNotAcquired)

// handle is one held session advisory lock and the connection it pins.
//
// The connection is used by one goroutine at a time: the health monitor
// while the lock is held, then Release once the monitor has exited. It is
// given back to the pool or destroyed exactly once (gone).
type handle struct {
	l    *Locker
	conn *pgxpool.Conn
	pgc  *pgconn.PgConn
	key  string
	// id is the advisory key the health checks look for in pg_locks: the
	// lock itself, or for a lock family the key's member lock (families.go).
	id    int64
	fam   *famHold // a lock family's hold; nil for the mutex
	token int64
	pid   uint32
	// terms are the lease and how it is kept (ttl.go); old holds the
	// values the session had of terms.names, set back at release.
	terms terms
	old   []string
	// renewed is when the last statement the server answered was sent,
	// as nanoseconds since granted (the grant statement's send time, on
	// the monotonic clock): the server's idle timer started later, so the
	// lock is surely held until renewed + lease − drift (see deadline).
	// The monitor stores it; Err and Done read it (lookAtClock).
	granted time.Time
	renewed atomic.Int64
	state   *backend.State
	risk    backend.Risk // a health check is slow to answer (health.go)
	// riskMu orders a check's slow report with its answer: checking
	// counts the checks begun and ended, so that a report running late,
	// after its check answered, does nothing.
	riskMu   sync.Mutex
	checking uint64

	relMu sync.Mutex // one Release at a time
	gone  sync.Once

	// Coordination with the monitor goroutine (health.go).
	mmu        sync.Mutex
	stopping   bool          // Release asked the monitor to stop
	idle       bool          // the monitor is waiting on the socket, not running a statement
	exited     chan struct{} // closed when the monitor returns
	startTimer *timerq.Entry // starts the monitor (monitorDelay)
}

var (
	_ locker.Handle   = (*handle)(nil)
	_ locker.AtRisker = (*handle)(nil)
)

func newHandle(l *Locker, conn *pgxpool.Conn, key string, g grant) *handle {
	return &handle{
		l:       l,
		conn:    conn,
		pgc:     conn.Conn().PgConn(),
		key:     key,
		id:      g.id,
		fam:     g.fam,
		token:   g.token,
		pid:     g.pid,
		terms:   g.terms,
		old:     g.old,
		granted: g.sent,
		state:   backend.NewState(),
		exited:  make(chan struct{}),
	}
}

func (h *handle) Key() string  { return h.key }
func (h *handle) Token() int64 { return h.token }

// Done and Err look at the clock first (see lookAtClock).
func (h *handle) Done() <-chan struct{} { h.lookAtClock(); return h.state.Done() }
func (h *handle) Err() error            { h.lookAtClock(); return h.state.Err() }

// Release unlocks the key (pg_advisory_unlock) and gives the connection back
// to the pool. If the unlock fails, or finds the lock no longer held, the
// connection is closed instead — which frees whatever the session still
// held — and the error wraps locker.ErrLost. Release waits for a health
// check in progress (at most one check interval) before it unlocks; if ctx
// ends first, the connection is closed instead of unlocked.
func (h *handle) Release(ctx context.Context) error {
	return h.release(ctx, false)
}

func (h *handle) release(ctx context.Context, byClose bool) error {
	h.relMu.Lock()
	defer h.relMu.Unlock()
	if h.state.Ended() {
		return backend.KeyError("release", h.key, h.state.Err())
	}
	h.stopMonitor()
	select {
	case <-h.exited:
	case <-ctx.Done():
		select {
		case <-h.exited: // the monitor had already stopped: unlock as usual
			return h.afterMonitor(ctx, byClose)
		default:
		}
		// A health check is still talking to the server. Close the socket
		// under it; the server frees the lock when it sees the close.
		h.state.End(h.unreleased(byClose, "gave up waiting for a health check"))
		_ = h.pgc.Conn().Close()
		<-h.exited
		h.discard()
		return backend.KeyError("release", h.key,
			fmt.Errorf("gave up waiting for a health check (%w); closed the connection instead, which frees the lock", ctx.Err()))
	}
	return h.afterMonitor(ctx, byClose)
}

// afterMonitor finishes a Release once the monitor has returned.
func (h *handle) afterMonitor(ctx context.Context, byClose bool) error {
	if h.state.Ended() { // the monitor found the lock lost
		return backend.KeyError("release", h.key, h.state.Err())
	}
	return h.unlock(ctx, byClose)
}

// unlock gives the lock up on the pinned connection. The monitor must not be
// running.
//
// The unlock gets at most locker.ReleaseTimeout: then the Locker's releaseQ
// closes the socket under it, which ends the read at once and, once the
// server sees it, the session and its lock. One runtime timer serves every
// release of the Locker; a context.WithTimeout of its own would arm one per
// release, and arming a timer wakes the runtime's network poller or an idle
// thread (see the Locker's monitorQ), which on a small machine costs more
// than the rest of the Locker's work for the release.
func (h *handle) unlock(ctx context.Context, byClose bool) error {
	nc := h.pgc.Conn()
	backstop := h.l.releaseQ.Add(func() { _ = nc.Close() })
	var ok bool
	var pid int32
	// The session's settings that kept the lease go back to what they
	// were (ttl.go), in the statement that unlocks.
	var err error
	switch {
	case h.fam != nil:
		err = h.conn.QueryRow(ctx, sqlFamRelease, h.fam.ik1, h.fam.ik2, h.terms.names, h.old, h.fam.channel).Scan(&ok, &pid)
	case h.terms.mutex14():
		err = h.conn.QueryRow(ctx, sqlUnlock14, h.id, h.old[0], h.old[1]).Scan(&ok, &pid)
	default:
		err = h.conn.QueryRow(ctx, sqlUnlockRestore, h.id, h.terms.names, h.old).Scan(&ok, &pid)
	}
	// The socket was closed at the bound, perhaps just after the answer
	// came: then the connection must not go back to the pool.
	closed := !backstop.Stop()
	if closed && err != nil {
		err = fmt.Errorf("no answer within %v (%w)", locker.ReleaseTimeout, err)
	}
	switch {
	case err == nil && ok && uint32(pid) == h.pid:
		h.state.End(releasedErr(byClose))
		if closed {
			h.discard() // a closed session holds no lock either
			return nil
		}
		h.l.life.Drop(h)
		h.gone.Do(h.conn.Release)
		return nil
	case err == nil && uint32(pid) != h.pid:
		h.unstrand()
		lost := fmt.Errorf("%w: %w: the unlock ran on server backend %d, not on %d that was granted the lock", locker.ErrLost, ErrPooler, pid, h.pid)
		h.state.End(lost)
		h.discard()
		return backend.KeyError("release", h.key, lost)
	case err == nil:
		lost := fmt.Errorf("%w: the session no longer held the lock when it was released", locker.ErrLost)
		h.state.End(lost)
		h.discard()
		return backend.KeyError("release", h.key, lost)
	case ctx.Err() != nil:
		// The caller gave up. The connection is closed, which frees the
		// lock as surely as the unlock would have, once the server sees it.
		h.state.End(h.unreleased(byClose, "the unlock had no answer in time"))
		h.discard()
		return backend.KeyError("release", h.key,
			fmt.Errorf("unlock interrupted (%w); closed the connection instead, which frees the lock", ctx.Err()))
	default:
		lost := fmt.Errorf("%w: unlock failed, the connection is closed: %w", locker.ErrLost, err)
		if byClose {
			lost = fmt.Errorf("%w (%w)", lost, locker.ErrClosed)
		}
		h.state.End(lost)
		h.discard()
		return backend.KeyError("release", h.key, lost)
	}
}

// unstrand gives back what the handle holds on its server backend, when
// a pooler routed a statement elsewhere (see unstrand).
func (h *handle) unstrand() bool {
	if h.fam != nil {
		return h.fam.unstrand(h.conn, h.pid)
	}
	return unstrand(h.conn, h.id, h.pid)
}

// discard destroys the connection (once) and forgets the handle.
func (h *handle) discard() {
	h.gone.Do(func() { destroy(h.conn) })
	h.l.life.Drop(h)
}

// unreleased is how a lock ends whose unlock got no answer and whose
// connection was closed instead: released, as far as the caller of Release
// is concerned (the server frees the lock when it sees the close, and
// nothing is left to do); for Close, a lock it could not release, which
// the interface's Close doc says is lost (and ErrClosed): the server may
// not see the close until the session's TCP timeouts give up.
func (h *handle) unreleased(byClose bool, why string) error {
	if !byClose {
		return locker.ErrReleased
	}
	return backend.KeyError("hold", h.key, fmt.Errorf("%w (%w): Close could not unlock it (%s); its connection is closed, and the server frees the lock when it sees that", locker.ErrLost, locker.ErrClosed, why))
}

func releasedErr(byClose bool) error {
	if byClose {
		return locker.ErrReleasedByClose
	}
	return locker.ErrReleased
}
