package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

// lockWait runs pg_advisory_lock on conn, abandoning the wait when ctx ends
// (see runWait).
func (l *Locker) lockWait(ctx context.Context, conn *pgxpool.Conn, id int64) (grant, error) {
	var token int64
	var pid int32
	out := l.runWait(ctx, conn.Conn().PgConn(), func(qctx context.Context) error {
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
	switch {
	case !out.interrupted && out.err != nil:
		// Whether the lock was granted is unknown: closing the session
		// frees it if it was.
		destroy(conn)
		return grant{}, fmt.Errorf("waiting for the lock: %w", out.err)
	case !out.interrupted:
		g := grant{token: token, pid: uint32(pid)}
		if err := l.verifySession(ctx, conn, id, g.pid); err != nil {
			destroy(conn)
			return grant{}, err
		}
		return g, nil
	case out.err == nil:
		// Granted in the same instant as ctx ended. Closing the session
		// gives the lock back; the connection is not reused, because the
		// cancel request may still be on its way to the backend.
		destroy(conn)
	case out.cancelAcked && isQueryCanceled(out.err) && !holdsAny(context.Background(), conn):
		// The cancel ended the wait (and was consumed by it): clean.
		conn.Release()
	default:
		destroy(conn)
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

// waitOutcome is how a waiting statement ended.
type waitOutcome struct {
	err         error // the statement's
	interrupted bool  // ctx ended before the statement did
	cancelAcked bool  // the server acknowledged a cancel request for it
}

// runWait runs run(qctx), a statement that may wait a long time, on pc in the
// calling goroutine; qctx is not cancelled by ctx. When ctx ends first, a
// goroutine (counted in l.cleanups, which Close waits for) sends the server a
// cancel request, as psql's Ctrl-C does, rather than closing the connection:
// a closed connection's backend would stay queued for the lock, holding a
// server connection slot, until granted the lock only to drop it then.
// On a live server the statement ends a round trip later. When the request
// cannot be delivered, or the statement has not ended abandonWait after ctx
// did (a dead link: nothing sent could reach the server anyway), the socket
// is closed instead, which ends the statement at once.
//
// When runWait returns interrupted with cancelAcked, the cancel request has
// reached the server; a connection whose statement it ended may be reused.
func (l *Locker) runWait(ctx context.Context, pc *pgconn.PgConn, run func(qctx context.Context) error) waitOutcome {
	qctx, stopQuery := context.WithCancel(context.Background())
	defer stopQuery()
	finished := make(chan struct{})
	settled := make(chan struct{}) // closed once the cancel was acknowledged or the socket closed
	var settleOnce sync.Once
	var acked bool
	settle := func(ok bool) {
		settleOnce.Do(func() {
			acked = ok
			close(settled)
		})
	}
	breakConn := func() {
		settle(false)
		stopQuery()
		_ = pc.Conn().Close()
	}
	l.cleanups.Add(1)
	stop := context.AfterFunc(ctx, func() {
		defer l.cleanups.Done()
		giveUp := time.AfterFunc(abandonWait, breakConn)
		cctx, cancel := context.WithTimeout(context.Background(), cancelRequestTimeout)
		err := pc.CancelRequest(cctx)
		cancel()
		if err != nil {
			breakConn()
		} else {
			settle(true)
		}
		<-finished
		giveUp.Stop()
	})
	err := run(qctx)
	close(finished)
	if stop() {
		l.cleanups.Done()
		return waitOutcome{err: err}
	}
	<-settled
	return waitOutcome{err: err, interrupted: true, cancelAcked: acked}
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
