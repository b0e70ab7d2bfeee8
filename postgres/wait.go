package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
//
// sqlLockWait sets lock_timeout (the wait's slice, see waitSlice) in the
// same statement, before the wait: the set_config is in the lock's
// argument, which is computed before the call. It is local to the
// statement's implicit transaction, so the server reverts it at the
// statement's end whatever the outcome, leaving the session's own setting
// in place. set_config returns the new value, never NULL, so the CASE
// always yields the key; should it ever not, the lock function (strict)
// would return NULL without locking, and the WHERE turns that into no row
// (an error) rather than a token without a lock. One statement instead of
// a batch of two saves a statement's work on the server on every wait
// (about 10 µs a handoff on the test machine).
//
// Both also set the session settings that keep the lease ($names to
// $values, see ttl.go) when, and only when, they grant the lock, and return
// what those settings were, for the unlock to set back. The old values are
// read in FROM (a subquery that OFFSET 0 keeps from being merged into the
// target list), before the target list sets the new ones; the setting
// subquery refers to the grant, so that it runs for a granted row only. A
// statement that fails is rolled back with its set_config calls, so a
// session that was not granted the lock keeps its settings.
//
// The mutex's statements also name application_name among the settings
// (see ownerSetting): its value there is the holder's escaped description,
// which sqlSettingValue prefixes with "locker" and the token just drawn, so
// that Inspect, from another session, finds the holder's token and
// description in pg_stat_activity. sqlLockWait draws the token in FROM for
// that (a LATERAL subquery on the grant, so it runs after it, and only
// for a granted row), where the target list can read it.
const (
	// sqlSettingValue is the value set_config gives setting s.n: s.v, but
	// for application_name "locker <token> <s.v>" (concat_ws skips an
	// empty s.v, made NULL).
	sqlSettingValue = `CASE WHEN s.n = 'application_name' THEN pg_catalog.concat_ws(' ', 'locker', t.token, NULLIF(s.v, '')) ELSE s.v END`

	sqlLockWait = `SELECT t.token, pg_catalog.pg_backend_pid(), o.old,
			(SELECT pg_catalog.count(pg_catalog.set_config(s.n, ` + sqlSettingValue + `, false)) FROM ROWS FROM (pg_catalog.unnest($4::text[]), pg_catalog.unnest($5::text[])) AS s(n, v) WHERE g.v IS NOT NULL)
		FROM pg_catalog.pg_advisory_lock(CASE WHEN pg_catalog.set_config('lock_timeout', $3, true) IS NOT NULL THEN $1::bigint END) AS g(v),
			LATERAL (SELECT pg_catalog.nextval($2::text::regclass) WHERE g.v IS NOT NULL OFFSET 0) AS t(token),
			(SELECT pg_catalog.array_agg(pg_catalog.current_setting(s.n) ORDER BY s.i) FROM pg_catalog.unnest($4::text[]) WITH ORDINALITY AS s(n, i) OFFSET 0) AS o(old)
		WHERE g.v IS NOT NULL`
	sqlLockTry = `SELECT t.token, pg_catalog.pg_backend_pid(), o.old,
			(SELECT pg_catalog.count(pg_catalog.set_config(s.n, ` + sqlSettingValue + `, false)) FROM ROWS FROM (pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::text[])) AS s(n, v) WHERE t.token IS NOT NULL)
		FROM (SELECT CASE WHEN pg_catalog.pg_try_advisory_lock($1) THEN pg_catalog.nextval($2::text::regclass) END OFFSET 0) AS t(token),
			(SELECT pg_catalog.array_agg(pg_catalog.current_setting(s.n) ORDER BY s.i) FROM pg_catalog.unnest($3::text[]) WITH ORDINALITY AS s(n, i) OFFSET 0) AS o(old)`
	sqlUnlock = `SELECT pg_catalog.pg_advisory_unlock($1), pg_catalog.pg_backend_pid()`

	// sqlUnlockRestore unlocks and sets the session settings $2 back to
	// $3, the values they had before the grant.
	sqlUnlockRestore = `SELECT pg_catalog.pg_advisory_unlock($1), pg_catalog.pg_backend_pid()
		FROM (SELECT pg_catalog.count(pg_catalog.set_config(s.n, s.v, false)) FROM ROWS FROM (pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::text[])) AS s(n, v) OFFSET 0) AS r`

	// sqlLockWait14, sqlLockTry14 and sqlUnlock14 are the statements above
	// for the mutex on PostgreSQL 14+, whose settings are always
	// idle_session_timeout and application_name (see terms.mutex14): the
	// same work with the two settings named in the statement, their values
	// passed and returned as scalars, not as arrays that the server
	// unnests and aggregates and the client encodes and decodes. That is
	// about 20 µs less per Acquire+Release on the test machine, the
	// cheapest acquisition there is. The target list, which sets them, is
	// computed after FROM, which reads their old values, and only for a
	// row that the WHERE (or the CASE) lets through: a granted one.
	sqlLockWait14 = `SELECT t.token, pg_catalog.pg_backend_pid(), o.idle, o.app,
			pg_catalog.set_config('idle_session_timeout', $4, false),
			pg_catalog.set_config('application_name', pg_catalog.concat_ws(' ', 'locker', t.token, NULLIF($5, '')), false)
		FROM pg_catalog.pg_advisory_lock(CASE WHEN pg_catalog.set_config('lock_timeout', $3, true) IS NOT NULL THEN $1::bigint END) AS g(v),
			LATERAL (SELECT pg_catalog.nextval($2::text::regclass) WHERE g.v IS NOT NULL OFFSET 0) AS t(token),
			(SELECT pg_catalog.current_setting('idle_session_timeout'), pg_catalog.current_setting('application_name') OFFSET 0) AS o(idle, app)
		WHERE g.v IS NOT NULL`
	sqlLockTry14 = `SELECT t.token, pg_catalog.pg_backend_pid(), o.idle, o.app,
			CASE WHEN t.token IS NOT NULL THEN pg_catalog.set_config('idle_session_timeout', $3, false) END,
			CASE WHEN t.token IS NOT NULL THEN pg_catalog.set_config('application_name', pg_catalog.concat_ws(' ', 'locker', t.token, NULLIF($4, '')), false) END
		FROM (SELECT CASE WHEN pg_catalog.pg_try_advisory_lock($1) THEN pg_catalog.nextval($2::text::regclass) END OFFSET 0) AS t(token),
			(SELECT pg_catalog.current_setting('idle_session_timeout'), pg_catalog.current_setting('application_name') OFFSET 0) AS o(idle, app)`
	sqlUnlock14 = `SELECT pg_catalog.pg_advisory_unlock($1), pg_catalog.pg_backend_pid()
		FROM (SELECT pg_catalog.set_config('idle_session_timeout', $2, false), pg_catalog.set_config('application_name', $3, false) OFFSET 0) AS r`

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
	id    int64    // the advisory key the health checks look for (see handle.id)
	fam   *famHold // a lock family's hold; nil for the mutex
	token int64
	pid   uint32    // the server backend that holds the lock
	sent  time.Time // when the statement that granted the lock was sent
	terms terms     // the lease, whose settings the statement set
	old   []string  // what the session's settings terms.names were before
}

// lockTry runs pg_try_advisory_lock on conn. On success conn stays pinned to
// the lock; on every other outcome it has been given back or destroyed.
func (l *Locker) lockTry(ctx context.Context, conn *pgxpool.Conn, id int64, t terms) (grant, error) {
	var token *int64
	var pid int32
	var old []string
	sent := time.Now()
	var err error
	if t.mutex14() {
		var idle, app string
		err = conn.QueryRow(ctx, sqlLockTry14, id, l.cfg.sequence, t.values[0], t.values[1]).Scan(&token, &pid, &idle, &app, nil, nil)
		old = []string{idle, app}
	} else {
		var set int64
		err = conn.QueryRow(ctx, sqlLockTry, id, l.cfg.sequence, t.names, t.values).Scan(&token, &pid, &old, &set)
	}
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
	g := grant{id: id, token: *token, pid: uint32(pid), sent: sent, terms: t, old: old}
	if err := l.verifySession(ctx, conn, id, g.pid, func() bool { return unstrand(conn, id, g.pid) }); err != nil {
		destroy(conn)
		return grant{}, err
	}
	return g, nil
}

// lockWait runs pg_advisory_lock on conn, in slices of t.period (see
// waitSlice), abandoning the wait when ctx ends (see runWait).
func (l *Locker) lockWait(ctx context.Context, conn *pgxpool.Conn, id int64, t terms) (grant, error) {
	g := grant{id: id, terms: t}
	out := l.runWait(ctx, conn.Conn().PgConn(), func(qctx context.Context) error {
		for {
			err := l.waitSlice(qctx, conn, id, &g)
			// The slice's lock_timeout, or a statement_timeout or
			// lock_timeout of the session (a role's default, say), ended
			// the wait on the server while ctx still allows more: wait
			// again.
			if !isServerTimeout(err) || ctx.Err() != nil {
				return err
			}
			held, herr := anyHeld(qctx, conn)
			if herr != nil {
				return fmt.Errorf("checking the session after a timed-out wait: %w", herr)
			}
			if !held {
				continue
			}
			// The lock was granted in the instant the slice's timeout
			// fired, and the statement was cancelled after the grant: the
			// session holds the lock, but no token was returned. Give it
			// back and wait again (the token drawn, if any, is skipped).
			if uerr := unlockAfterTimeout(qctx, conn, id); uerr != nil {
				return fmt.Errorf("%w; giving back the lock granted as the wait timed out: %w", err, uerr)
			}
		}
	})
	switch {
	case !out.interrupted && errors.Is(out.err, errSilent):
		destroy(conn)
		return grant{}, out.err
	case !out.interrupted && out.err != nil:
		// Whether the lock was granted is unknown: closing the session
		// frees it if it was.
		destroy(conn)
		return grant{}, fmt.Errorf("waiting for the lock: %w", out.err)
	case !out.interrupted:
		if err := l.verifySession(ctx, conn, id, g.pid, func() bool { return unstrand(conn, id, g.pid) }); err != nil {
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
	return grant{}, fmt.Errorf("waiting for the lock: %w", l.ctxErr(ctx))
}

// errSilent marks a wait whose connection stopped answering.
var errSilent = errors.New("postgres: the server stopped answering while the lock was awaited")

// waitSlice waits for the lock for at most one slice, the check period of
// the lease (the health-check interval, or a third of the lease if that is
// shorter): the server itself ends the wait then (lock_timeout, for this
// statement only), and the caller waits again. A waiting connection thus
// answers at least once per slice, and a waiter is checked as a held lock
// is: when no answer has come one slice after the server should have sent
// one, the link is taken for dead and the socket is closed. That, once the
// server sees it, ends the session — its place in the queue, or a lock
// granted to it meanwhile that nobody will ever see. Without slices a
// waiter cut off from the server would stay queued, be granted the lock
// when the holder releases, and keep it, unseen, until its session died.
// With them the server drops a silent waiter from its queue within a slice
// by itself, and a grant it made in that slice ends when the waiter gives
// up, or, if the server never hears of that, by the lease the grant set on
// the session (idle_session_timeout).
//
// A slice no longer than a third of the lease also keeps a grant's lease
// fresh: the holder counts it from the moment the slice's statement was
// sent, so at least two thirds of it are left when the grant arrives.
//
// The price: at each slice's end the waiter leaves the server's queue and
// joins it again at the back, so waiters are served about, not exactly, in
// the order they came.
func (l *Locker) waitSlice(ctx context.Context, conn *pgxpool.Conn, id int64, g *grant) error {
	slice := g.terms.period
	nc := conn.Conn().PgConn().Conn()
	backstop := l.sliceBackstop(slice, func() { _ = nc.Close() })
	g.sent = time.Now()
	var err error
	// The statement's answers go straight into g (on the heap already),
	// not into locals that the scan would move there one by one.
	if t := g.terms; t.mutex14() {
		g.old = make([]string, 2)
		err = conn.QueryRow(ctx, sqlLockWait14, id, l.cfg.sequence, l.sliceTimeout(slice), t.values[0], t.values[1]).Scan(&g.token, &g.pid, &g.old[0], &g.old[1], nil, nil)
	} else {
		var set int64
		err = conn.QueryRow(ctx, sqlLockWait, id, l.cfg.sequence, l.sliceTimeout(slice), t.names, t.values).Scan(&g.token, &g.pid, &g.old, &set)
	}
	if !backstop.Stop() {
		// Whatever the statement returned, the socket is (being) closed.
		return fmt.Errorf("%w: no answer within %v of asking for the lock with lock_timeout %v; the link seems dead, so the connection is closed, which ends the wait on the server (%v)",
			errSilent, 2*slice, slice, err)
	}
	return err
}

// stopper is a timer that can be stopped: Stop reports whether that kept
// its function from running.
type stopper interface{ Stop() bool }

// sliceBackstop runs f 2×slice from now, unless stopped: on the Locker's
// shared queue for the usual slice, the health-check interval (one runtime
// timer for every wait of the Locker), on a timer of its own for the
// shorter slice of a short lease.
func (l *Locker) sliceBackstop(slice time.Duration, f func()) stopper {
	if slice == l.cfg.interval {
		return l.backstopQ.Add(f)
	}
	return time.AfterFunc(2*slice, f)
}

// sliceTimeout is lockTimeout(slice), made once for the usual slice.
func (l *Locker) sliceTimeout(slice time.Duration) string {
	if slice == l.cfg.interval {
		return l.intervalTimeout
	}
	return lockTimeout(slice)
}

// lockTimeout is d as a lock_timeout value, at least 1ms (0 turns it off).
func lockTimeout(d time.Duration) string {
	return strconv.FormatInt(max(1, d.Milliseconds()), 10) + "ms"
}

// verifySession makes sure the backend that granted the lock is the session
// the connection keeps. Connected directly, the backend pid equals the one
// the server announced at connect time, and nothing more is needed. When
// they differ a pooler or proxy sits in between. Unless it was declared a
// session pooler the lock is refused: a transaction-mode pooler can send the
// next statement to the same backend by chance, so no test can tell the
// modes apart for sure. For a declared one, a second statement must land on
// the same backend and see the lock. undo gives back what the lock
// statement left on backend pid (see unstrand), reporting whether it did.
func (l *Locker) verifySession(ctx context.Context, conn *pgxpool.Conn, id int64, pid uint32, undo func() bool) error {
	announced := conn.Conn().PgConn().PID()
	if pid == announced {
		return nil
	}
	if !l.cfg.sessionOK {
		undo()
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
		if !undo() {
			stranded = "; the lock may stay on that server connection until the pooler closes it"
		}
		return fmt.Errorf("%w: the lock was granted by server backend %d, but the next statement ran on backend %d; session advisory locks need session pooling or a direct connection (LockTx works in transaction mode)%s",
			ErrPooler, pid, pid2, stranded)
	}
	return nil
}

// checkSessionClean makes sure, behind a declared session pooler, that the
// server session conn is about to lock on holds no advisory lock yet. One
// that does was handed on from an earlier client (or an earlier user of the
// connection) with its locks: the pooler does not reset sessions between
// clients. A session lock is reentrant, so locking a key that session
// already held would be granted at once, and the unlock would leave it held;
// and a holder that dies or loses its lock — which closes its connection,
// trusting the session to end with it — would leave its lock to whichever
// client the pooler gives that session next. PgBouncer's default
// server_reset_query, DISCARD ALL, unlocks them; an empty one does not.
func checkSessionClean(ctx context.Context, conn *pgxpool.Conn) error {
	var held bool
	if err := conn.QueryRow(ctx, sqlAnyHeld).Scan(&held); err != nil {
		return fmt.Errorf("checking the pooler's server session: %w", err)
	}
	if held {
		return fmt.Errorf("%w: the server session the pooler gave this connection already holds advisory locks, so the pooler hands sessions from client to client without resetting them; set its reset query to DISCARD ALL (PgBouncer: server_reset_query = DISCARD ALL, the default) or to one that runs SELECT pg_advisory_unlock_all()",
			ErrPooler)
	}
	return nil
}

// unstrand tries to give back a lock that a transaction-mode pooler left on
// server backend pid, by sending statements until one lands there. It
// reports whether it did. Only that backend's own hold is touched: the
// unlock runs nowhere else.
func unstrand(conn *pgxpool.Conn, id int64, pid uint32) bool {
	return unstrandWith(conn, pid, sqlUnstrand, id, int32(pid))
}

// unstrandWith is unstrand with a statement of its own, which returns the
// backend's pid and, where that is pid, whether it unlocked.
func unstrandWith(conn *pgxpool.Conn, pid uint32, sql string, args ...any) bool {
	ctx, cancel := context.WithTimeout(context.Background(), cancelGrace)
	defer cancel()
	for range 16 {
		var got int32
		var unlocked *bool
		err := conn.QueryRow(ctx, sql, args...).Scan(&got, &unlocked)
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
// goroutine (counted by l.life, which Close waits for) sends the server a
// cancel request, as psql's Ctrl-C does, rather than closing the connection:
// a closed connection's backend would stay queued for the lock, holding a
// server connection slot, until granted the lock only to drop it then.
// On a live server the statement ends a round trip later. When the request
// cannot be delivered, or the statement has not ended abandonWait after ctx
// did (a dead link: nothing sent could reach the server anyway), the socket
// is closed instead, which ends the statement at once. Close shortens both
// bounds to its grace (l.life.Abandoned), so that it returns promptly.
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
	cleanup := func() {
		giveUp := time.AfterFunc(abandonWait, breakConn)
		defer giveUp.Stop()
		stopHurry := context.AfterFunc(l.life.Abandoned(), breakConn)
		defer stopHurry()
		cctx, cancel := context.WithTimeout(l.life.Abandoned(), cancelRequestTimeout)
		err := pc.CancelRequest(cctx)
		cancel()
		if err != nil {
			breakConn()
		} else {
			settle(true)
		}
		<-finished
	}
	stop := context.AfterFunc(ctx, func() {
		if !l.life.Run(cleanup) {
			breakConn() // Close is over: no time to be polite
		}
	})
	err := run(qctx)
	close(finished)
	if stop() {
		return waitOutcome{err: err}
	}
	<-settled
	return waitOutcome{err: err, interrupted: true, cancelAcked: acked}
}

// unlockAfterTimeout gives back the lock on id that conn's session was
// granted as its wait timed out; the session holds nothing else.
func unlockAfterTimeout(ctx context.Context, conn *pgxpool.Conn, id int64) error {
	ctx, cancel := context.WithTimeout(ctx, cancelGrace)
	defer cancel()
	var ok bool
	var pid int32
	if err := conn.QueryRow(ctx, sqlUnlock, id).Scan(&ok, &pid); err != nil {
		return err
	}
	if !ok {
		return errors.New("the session held an advisory lock, but not this one")
	}
	return nil
}

// holdsAny reports whether conn's session holds any advisory lock; on error
// it says true, so that the caller does not reuse the connection.
func holdsAny(ctx context.Context, conn *pgxpool.Conn) bool {
	held, err := anyHeld(ctx, conn)
	return held || err != nil
}

// anyHeld asks, within cancelGrace, whether conn's session holds any
// advisory lock.
func anyHeld(ctx context.Context, conn *pgxpool.Conn) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, cancelGrace)
	defer cancel()
	var held bool
	err := conn.QueryRow(ctx, sqlAnyHeld).Scan(&held)
	return held, err
}

// isServerTimeout reports a statement ended by statement_timeout (or
// another session's pg_cancel_backend: both are query_canceled) or by
// lock_timeout.
func isServerTimeout(err error) bool {
	if err == nil {
		return false // without the heap allocation of pe below
	}
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "57014" || pe.Code == "55P03")
}

func isQueryCanceled(err error) bool {
	if err == nil {
		return false
	}
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
