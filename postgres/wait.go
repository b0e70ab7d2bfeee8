package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The statements that take a lock also draw the fencing token, in the same
// statement and so on the same connection, strictly after the grant: the
// function in FROM (or the CASE condition) runs before the target list. A
// later holder is granted only after this one unlocked, which is after this
// one's nextval, so its nextval is higher.
const (
	sqlLockWait = `SELECT pg_catalog.nextval($2::text::regclass), pg_catalog.pg_backend_pid() FROM pg_catalog.pg_advisory_lock($1)`
	sqlLockTry  = `SELECT CASE WHEN pg_catalog.pg_try_advisory_lock($1) THEN pg_catalog.nextval($2::text::regclass) END, pg_catalog.pg_backend_pid()`
	sqlUnlock   = `SELECT pg_catalog.pg_advisory_unlock($1), pg_catalog.pg_backend_pid()`

	// sqlHeld asks which backend answers and whether it holds the lock whose
	// bigint key has the given high and low halves (pg_locks shows a bigint
	// advisory key as classid, objid, with objsubid 1).
	sqlHeld = `SELECT pg_catalog.pg_backend_pid(), EXISTS (SELECT 1 FROM pg_catalog.pg_locks
		WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid() AND granted
		AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1)`

	// sqlUnstrand unlocks only when it runs on the given backend.
	sqlUnstrand = `SELECT pg_catalog.pg_backend_pid(), CASE WHEN pg_catalog.pg_backend_pid() = $2 THEN pg_catalog.pg_advisory_unlock($1) END`

	// sqlAnyHeld checks a connection before it goes back to the pool after
	// an abandoned wait.
	sqlAnyHeld = `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid())`
)

// grant is what the lock statement returned.
type grant struct {
	token int64
	pid   uint32 // the server backend that holds the lock
}

// lockTry runs pg_try_advisory_lock on conn. On success conn stays pinned to
// the lock; on every other outcome it has been given back or destroyed.
func (l *Locker) lockTry(ctx context.Context, conn *pgxpool.Conn, id int64) (grant, error) {
	var token *int64
	var pid int32
	err := conn.QueryRow(ctx, sqlLockTry, id, l.cfg.sequence).Scan(&token, &pid)
	if err != nil {
		// Whether the lock was granted is unknown: closing the session
		// frees it if it was.
		destroy(conn)
		return grant{}, fmt.Errorf("trying the lock: %w", err)
	}
	if token == nil {
		conn.Release() // nothing was taken; the connection is clean
		return grant{}, errNotAcquired
	}
	g := grant{token: *token, pid: uint32(pid)}
	if err := l.verifySession(ctx, conn, id, g.pid); err != nil {
		destroy(conn)
		return grant{}, err
	}
	return g, nil
}

// lockWait runs pg_advisory_lock on conn. When ctx ends first it abandons the
// server-side wait and cleans the connection up, in a goroutine that Close
// waits for, and returns when that is done or after abandonWait.
func (l *Locker) lockWait(ctx context.Context, conn *pgxpool.Conn, id int64) (grant, error) {
	var token int64
	var pid int32
	w := startWait(conn.Conn().PgConn(), func(qctx context.Context) error {
		for {
			err := conn.QueryRow(qctx, sqlLockWait, id, l.cfg.sequence).Scan(&token, &pid)
			// A statement_timeout or lock_timeout of the session (a role's
			// default, say) ends the wait on the server while ctx still
			// allows more: wait again, unless the lock was somehow granted.
			if !isServerTimeout(err) || ctx.Err() != nil || holdsAny(qctx, conn) {
				return err
			}
		}
	})
	select {
	case err := <-w.done:
		w.stopQuery()
		if err != nil {
			// Whether the lock was granted is unknown: closing the session
			// frees it if it was.
			destroy(conn)
			return grant{}, fmt.Errorf("waiting for the lock: %w", err)
		}
		g := grant{token: token, pid: uint32(pid)}
		if err := l.verifySession(ctx, conn, id, g.pid); err != nil {
			destroy(conn)
			return grant{}, err
		}
		return g, nil
	case <-ctx.Done():
	}
	// Abandon the wait before returning, so that no backend of ours is still
	// queued for the lock when the caller (or anyone) tries again. On a dead
	// link that can take until the connection is given up; then return after
	// abandonWait and let the cleanup finish alone: nothing sent over that
	// link could reach the server anyway.
	cleaned := make(chan struct{})
	l.cleanups.Add(1)
	go func() {
		defer l.cleanups.Done()
		defer close(cleaned)
		cancelSent, err := w.abandon()
		switch {
		case err == nil:
			// Granted in the same instant. Closing the session gives the
			// lock back; the connection is not reused, because the cancel
			// request may still be on its way to the backend.
			destroy(conn)
		case cancelSent && isQueryCanceled(err) && !holdsAny(context.Background(), conn):
			// The cancel ended the wait (and was consumed by it): clean.
			conn.Release()
		default:
			destroy(conn)
		}
	}()
	t := time.NewTimer(abandonWait)
	defer t.Stop()
	select {
	case <-cleaned:
	case <-t.C:
	}
	return grant{}, fmt.Errorf("waiting for the lock: %w", context.Cause(ctx))
}

// verifySession makes sure the backend that granted the lock is the session
// the connection keeps. Connected directly, the backend pid equals the one
// the server announced at connect time, and nothing more is needed. When
// they differ a pooler or proxy sits in between. Unless it was declared a
// session pooler the lock is refused: a transaction-mode pooler can send the
// next statement to the same backend by chance, so no test can tell the
// modes apart for sure. For a declared one, a second statement must land on
// the same backend and see the lock.
func (l *Locker) verifySession(ctx context.Context, conn *pgxpool.Conn, id int64, pid uint32) error {
	announced := conn.Conn().PgConn().PID()
	if pid == announced {
		return nil
	}
	if !l.cfg.sessionOK {
		unstrand(conn, id, pid)
		return fmt.Errorf("%w: the lock was granted by server backend %d, but the connection announced backend %d at connect time, so a pooler or proxy sits in between; if it keeps one server session per connection (PgBouncer pool_mode=session) declare it with WithSessionPooler (URL: lock_session_pooler=true); in transaction mode use LockTx",
			ErrPooler, pid, announced)
	}
	hi, lo := keyHalves(id)
	var pid2 int32
	var held bool
	if err := conn.QueryRow(ctx, sqlHeld, hi, lo).Scan(&pid2, &held); err != nil {
		return fmt.Errorf("verifying the session after the grant: %w", err)
	}
	if uint32(pid2) != pid || !held {
		stranded := ""
		if !unstrand(conn, id, pid) {
			stranded = "; the lock may stay on that server connection until the pooler closes it"
		}
		return fmt.Errorf("%w: the lock was granted by server backend %d, but the next statement ran on backend %d; session advisory locks need session pooling or a direct connection (LockTx works in transaction mode)%s",
			ErrPooler, pid, pid2, stranded)
	}
	return nil
}

// unstrand tries to give back a lock that a transaction-mode pooler left on
// server backend pid, by sending statements until one lands there. It
// reports whether it did. Only that backend's own hold is touched: the
// unlock runs nowhere else.
func unstrand(conn *pgxpool.Conn, id int64, pid uint32) bool {
	ctx, cancel := context.WithTimeout(context.Background(), cancelGrace)
	defer cancel()
	for range 16 {
		var got int32
		var unlocked *bool
		err := conn.QueryRow(ctx, sqlUnstrand, id, int32(pid)).Scan(&got, &unlocked)
		if err != nil {
			return false
		}
		if uint32(got) == pid {
			return unlocked != nil && *unlocked
		}
	}
	return false
}

// wait is a statement that may wait a long time, running in a goroutine of
// its own so that the caller can stop waiting for it the moment its context
// ends.
type wait struct {
	pc        *pgconn.PgConn
	stopQuery context.CancelFunc
	done      chan error // the statement's result, sent once
}

// startWait runs run(qctx) on pc in a new goroutine. qctx is not cancelled by
// the caller's context; abandon ends the statement instead.
func startWait(pc *pgconn.PgConn, run func(qctx context.Context) error) *wait {
	qctx, stop := context.WithCancel(context.Background())
	w := &wait{pc: pc, stopQuery: stop, done: make(chan error, 1)}
	go func() { w.done <- run(qctx) }()
	return w
}

// abandon ends the statement and returns its result. It sends the server a
// cancel request (as psql's Ctrl-C does) rather than closing the connection:
// a closed connection's backend would stay queued for the lock, holding a
// server connection slot, until granted the lock only to drop it. If the
// request cannot be delivered within cancelRequestTimeout, or the statement
// does not end within cancelGrace after it, the socket is closed after all.
// cancelSent says whether a cancel request went out (none does when the
// statement had already ended); when abandon returns, none is in flight.
func (w *wait) abandon() (cancelSent bool, err error) {
	defer w.stopQuery()
	select {
	case err := <-w.done:
		return false, err
	default:
	}
	cctx, cancel := context.WithTimeout(context.Background(), cancelRequestTimeout)
	cerr := w.pc.CancelRequest(cctx)
	cancel()
	if cerr != nil {
		w.breakConn()
		return true, <-w.done
	}
	t := time.NewTimer(cancelGrace)
	defer t.Stop()
	select {
	case err := <-w.done:
		return true, err
	case <-t.C:
		w.breakConn()
		return true, <-w.done
	}
}

// breakConn makes the statement fail at once, whatever the pool's
// configuration does with a cancelled context.
func (w *wait) breakConn() {
	w.stopQuery()
	_ = w.pc.Conn().Close()
}

// holdsAny reports whether conn's session holds any advisory lock; on error
// it says true, so that the caller does not reuse the connection.
func holdsAny(ctx context.Context, conn *pgxpool.Conn) bool {
	ctx, cancel := context.WithTimeout(ctx, cancelGrace)
	defer cancel()
	var held bool
	if err := conn.QueryRow(ctx, sqlAnyHeld).Scan(&held); err != nil {
		return true
	}
	return held
}

// isServerTimeout reports a statement ended by statement_timeout (or
// another session's pg_cancel_backend: both are query_canceled) or by
// lock_timeout.
func isServerTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "57014" || pe.Code == "55P03")
}

func isQueryCanceled(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "57014"
}

// destroy closes a pinned connection and removes it from the pool, so that a
// connection that may still hold a lock never goes back to the pool. The
// server ends the session, and with it the session's locks, when it sees
// the socket close.
func destroy(conn *pgxpool.Conn) {
	c := conn.Hijack()
	// Close the socket first: a polite Terminate could hang on a dead link.
	_ = c.PgConn().Conn().Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// keyHalves splits a bigint advisory key the way pg_locks shows it.
func keyHalves(id int64) (hi, lo int64) {
	u := uint64(id)
	return int64(u >> 32), int64(u & 0xFFFFFFFF)
}
