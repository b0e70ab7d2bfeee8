package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// The lock families: semaphores and reader-writer locks (see the package
// documentation, "Lock families", for the algorithm and why it is not
// PostgreSQL's own queue of pg_advisory_lock_shared).
var (
	_ locker.Semaphorer = (*Locker)(nil)
	_ locker.ReadWriter = (*Locker)(nil)
)

// AcquireSemaphore waits until one of the n permits of key is held, ctx is
// done, or the Locker is closed. Permits are granted first come, first
// served; a holder with another n fails at once with an error wrapping
// locker.ErrLimitMismatch. Each permit pins a connection, as a lock does.
func (l *Locker) AcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	return l.acquireFamily(ctx, "acquire-semaphore", key, famSem, n, true, opts)
}

// TryAcquireSemaphore takes one of the n permits of key if one is free and
// nobody waits for it, and fails with an error wrapping
// locker.ErrNotAcquired otherwise.
func (l *Locker) TryAcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	return l.acquireFamily(ctx, "try-acquire-semaphore", key, famSem, n, false, opts)
}

// AcquireRead waits until key is held for reading: no writer holds it, and
// no writer that came first still waits for it.
func (l *Locker) AcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return l.acquireFamily(ctx, "acquire-read", key, famRW, rwReader, true, opts)
}

// TryAcquireRead takes key for reading if no writer holds it or waits for
// it, and fails with an error wrapping locker.ErrNotAcquired otherwise.
func (l *Locker) TryAcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return l.acquireFamily(ctx, "try-acquire-read", key, famRW, rwReader, false, opts)
}

// AcquireWrite waits until key is held for writing: no reader or writer
// holds it, and none that came first still waits for it.
func (l *Locker) AcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return l.acquireFamily(ctx, "acquire-write", key, famRW, rwWriter, true, opts)
}

// TryAcquireWrite takes key for writing if nobody holds it or waits for
// it, and fails with an error wrapping locker.ErrNotAcquired otherwise.
func (l *Locker) TryAcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return l.acquireFamily(ctx, "try-acquire-write", key, famRW, rwWriter, false, opts)
}

// The families, as the code in their attribute lock (see below), and what
// a participant of a reader-writer lock is.
const (
	famRW  = 1
	famSem = 2

	rwReader = 0
	rwWriter = 1
)

// A participant of a family lock — a holder, or a waiter in the queue — is
// one pinned session holding these session advisory locks (T is its
// ticket, a value of the token sequence, unique to it):
//
//   - the member lock of the key, a bigint key hashed from the family, the
//     prefix and the key (famKey), in share mode: pg_locks lists the
//     sessions that take part in the key's lock;
//   - its identity, the int4 pair (1<<30 | T>>32, low 32 bits of T), in
//     exclusive mode, for as long as it takes part: pg_locks gives its
//     ticket, and a reader-writer participant that must wait for it waits
//     for this lock;
//   - its attribute, the int4 pair (3<<30 | family, value), in share mode:
//     a reader (0) or a writer (1), or a semaphore's n;
//   - a semaphore's participant that waits also holds (2<<30 | T>>32, low
//     32 bits of T) in exclusive mode until it is admitted: the participant
//     behind it waits for that.
//
// Tickets stay below 2^62 (see WithTokenBase), so T>>32 fits in 30 bits.
const (
	markIdentity = 1 << 30
	markWaiting  = 2 << 30
	markAttr     = 3 << 30
)

// famSQLKeys are SQL expressions of the int4 pair keys of ticket t.
func identityKeySQL(t string) string {
	return "((" + t + " >> 32) | " + strconv.Itoa(markIdentity) + ")::int4, " + t + "::bit(32)::int4"
}

func waitingKeySQL(t string) string {
	return "((" + t + " >> 32) | " + strconv.FormatInt(markWaiting, 10) + "::int8)::bit(32)::int4, " + t + "::bit(32)::int4"
}

// identityKey is the int4 pair of the identity lock of ticket t.
func identityKey(t int64) (int32, int32) {
	return int32(uint32(markIdentity) | uint32(t>>32)), int32(uint32(t))
}

// famParticipants lists the participants of the key whose member lock is
// member (a bigint) and whose family is code, from one pg_locks snapshot:
// their tickets and attributes (the caller keeps those before its own
// ticket). A participant caught half
// registered or half gone, which only a participant that came later or is
// leaving can be, has no ticket or no attribute: the first is not listed,
// the second is not taken for a writer or another limit.
func famParticipants(member, code string) string {
	return `SELECT
			pg_catalog.max(CASE WHEN l.objsubid = 2 AND l.mode = 'ExclusiveLock' AND l.classid::int8 >> 30 = 1
				THEN ((l.classid::int8 & 1073741823) << 32) | l.objid::int8 END) AS ticket,
			pg_catalog.max(CASE WHEN l.objsubid = 2 AND l.classid::int8 = (` + strconv.FormatInt(markAttr, 10) + `::int8 | ` + code + `)
				THEN l.objid::int8 END) AS val
		FROM pg_catalog.pg_locks l
		WHERE l.locktype = 'advisory' AND l.granted
			AND l.database = (SELECT db.oid FROM pg_catalog.pg_database db WHERE db.datname = pg_catalog.current_database())
		GROUP BY l.pid
		HAVING pg_catalog.bool_or(l.objsubid = 1 AND l.classid::int8 = (` + member + ` >> 32) & 4294967295 AND l.objid::int8 = ` + member + ` & 4294967295)`
}

// famDecide decides, from the participants p that came before, whether a
// participant of family code with attribute value is admitted, and if not
// whom it waits for:
//
//   - a writer is admitted when nobody came before it, and waits for the
//     last participant before it to leave;
//   - a reader is admitted when no writer came before it, and waits for the
//     last such writer to leave;
//   - a semaphore's participant is admitted when fewer than n came before
//     it. The first one not admitted (exactly n before it) waits for a
//     notification that a permit was released (target NULL); the second
//     for the first to be admitted or leave, and the others for the one two
//     ahead of them. So an admission wakes the second waiter, now first,
//     and the third, now second, which starts to listen for releases
//     while the first waits for one: the new first waiter is listening
//     already, and no more than two waiters are woken.
//
// It also yields the attribute of a semaphore participant whose n differs
// (bad), and how many came before (count).
func famDecide(code, value string) string {
	return `SELECT
			CASE WHEN ` + code + ` = 2 THEN pg_catalog.count(*) < ` + value + `
				WHEN ` + value + ` = 1 THEN pg_catalog.count(*) = 0
				ELSE pg_catalog.max(p.ticket) FILTER (WHERE p.val = 1) IS NULL END,
			pg_catalog.max(p.val) FILTER (WHERE ` + code + ` = 2 AND p.val <> ` + value + `),
			CASE WHEN ` + code + ` = 2 THEN CASE WHEN pg_catalog.count(*) = ` + value + ` + 1 THEN pg_catalog.max(p.ticket)
					WHEN pg_catalog.count(*) > ` + value + ` + 1 THEN (pg_catalog.array_agg(p.ticket ORDER BY p.ticket DESC))[2] END
				WHEN ` + value + ` = 1 THEN pg_catalog.max(p.ticket)
				ELSE pg_catalog.max(p.ticket) FILTER (WHERE p.val = 1) END,
			pg_catalog.count(*)`
}

// sqlFamRegister registers a participant, under the key's gate ($1, a
// transaction lock held to the end of the statement, so that
// registrations of one key are one at a time and a ticket drawn later
// belongs to a participant registered later), and tells it whether it is
// admitted. It registers nothing when the limit differs (bad) or when it
// is not admitted and $5 (wait) is false: then TryAcquire fails, leaving
// nothing. A participant admitted at once takes its ticket as its token:
// it was drawn at the grant. Like the mutex's lock statements it sets the
// lease ($7 to $8) on the session, which now keeps a lock or a place in
// the queue, and returns what they were.
//
// The order of evaluation is forced by references: the participants are
// listed in a LATERAL subquery (OFFSET 0 keeps it one) that refers to the
// gate's row, so pg_locks is read once the gate is held; the ticket
// refers to the decision, the locks to the ticket, and the settings, in
// the target list, to the locks.
//
// $1 gate, $2 member, $3 family, $4 value, $5 wait, $6 sequence, $7 names,
// $8 values.
var sqlFamRegister = `SELECT d.admit, d.bad, d.target, d.count, r.ticket, pg_catalog.pg_backend_pid(), o.old,
		(SELECT pg_catalog.count(pg_catalog.set_config(s.n, s.v, false)) FROM ROWS FROM (pg_catalog.unnest($7::text[]), pg_catalog.unnest($8::text[])) AS s(n, v) WHERE k.n > 0)
	FROM (SELECT 1 FROM pg_catalog.pg_advisory_xact_lock($1::int8) OFFSET 0) AS g(one),
		LATERAL (` + famDecide("$3::int4", "$4::int4") + `
			FROM (` + famParticipants("$2::int8", "$3::int4") + `) AS p
			WHERE p.ticket IS NOT NULL AND g.one = 1
			OFFSET 0) AS d(admit, bad, target, count),
		LATERAL (SELECT CASE WHEN d.bad IS NULL AND (d.admit OR $5::bool) THEN pg_catalog.nextval($6::text::regclass) END OFFSET 0) AS r(ticket),
		LATERAL (SELECT pg_catalog.count(*) FROM (VALUES
				(pg_catalog.pg_advisory_lock_shared($2::int8)::text),
				(pg_catalog.pg_advisory_lock(` + identityKeySQL("r.ticket") + `)::text),
				(pg_catalog.pg_advisory_lock_shared((` + strconv.FormatInt(markAttr, 10) + `::int8 | $3::int4)::bit(32)::int4, $4::int4)::text),
				(CASE WHEN NOT d.admit THEN pg_catalog.pg_advisory_lock(` + waitingKeySQL("r.ticket") + `)::text END)
			) AS x(v) WHERE r.ticket IS NOT NULL OFFSET 0) AS k(n),
		(SELECT pg_catalog.array_agg(pg_catalog.current_setting(s.n) ORDER BY s.i) FROM pg_catalog.unnest($7::text[]) WITH ORDINALITY AS s(n, i) OFFSET 0) AS o(old)`

// sqlFamStep is one slice of a participant's wait: it waits, for at most
// $1 (lock_timeout, for this statement only), for its target $2 to leave
// (a reader-writer participant: the target's identity) or to be admitted
// (a semaphore's: the target's waiting lock), in share mode and for the
// statement only; then, or at once when $2 is NULL, it lists the
// participants before it again and decides. Admitted, it draws its token,
// and a semaphore's participant gives up its waiting lock, which wakes the
// one behind it.
//
// $1 slice, $2 target, $3 member, $4 family, $5 value, $6 own ticket,
// $7 sequence.
var sqlFamStep = `SELECT d.admit, d.target, d.count, t.token, pg_catalog.pg_backend_pid()
	FROM (SELECT 1 FROM pg_catalog.pg_advisory_xact_lock_shared(
			CASE WHEN pg_catalog.set_config('lock_timeout', $1::text, true) IS NOT NULL THEN
				CASE WHEN $4::int4 = 2 THEN ((($2::int8 >> 32) | ` + strconv.FormatInt(markWaiting, 10) + `::int8)::bit(32)::int4)
					ELSE ((($2::int8 >> 32) | ` + strconv.Itoa(markIdentity) + `)::int4) END END,
			$2::int8::bit(32)::int4) OFFSET 0) AS w(one),
		LATERAL (` + famDecide("$4::int4", "$5::int4") + `
			FROM (` + famParticipants("$3::int8", "$4::int4") + `) AS p
			WHERE p.ticket < $6::int8 AND w.one = 1
			OFFSET 0) AS d(admit, bad, target, count),
		LATERAL (SELECT CASE WHEN d.admit THEN pg_catalog.nextval($7::text::regclass) END,
				CASE WHEN d.admit AND $4::int4 = 2 THEN pg_catalog.pg_advisory_unlock(` + waitingKeySQL("$6::int8") + `) END
			OFFSET 0) AS t(token, gaveup)`

// sqlFamRelease ends a participation: it unlocks the identity (whose
// result says whether the session still took part), then every advisory
// lock of the session, sets the lease's settings back ($3 to $4), and for
// a semaphore ($5, its channel) notifies the first waiter.
var sqlFamRelease = `SELECT u.ok, pg_catalog.pg_backend_pid()
	FROM (SELECT pg_catalog.pg_advisory_unlock($1::int4, $2::int4) OFFSET 0) AS u(ok),
		LATERAL (SELECT pg_catalog.pg_advisory_unlock_all(),
				CASE WHEN $5::text IS NOT NULL THEN pg_catalog.pg_notify($5::text, '') END
			WHERE u.ok IS NOT NULL OFFSET 0) AS x,
		(SELECT pg_catalog.count(pg_catalog.set_config(s.n, s.v, false)) FROM ROWS FROM (pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::text[])) AS s(n, v) OFFSET 0) AS r`

// sqlFamLeave takes a waiter out of the queue: every advisory lock of the
// session goes, and the lease's settings go back ($1 to $2).
const sqlFamLeave = `SELECT r.n FROM (SELECT pg_catalog.count(pg_catalog.set_config(s.n, s.v, false)) FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[])) AS s(n, v) OFFSET 0) AS r(n),
		LATERAL (SELECT pg_catalog.pg_advisory_unlock_all() WHERE r.n IS NOT NULL OFFSET 0) AS x`

// sqlFamUnstrand gives back, on backend $2 only, what a participant holds
// once admitted: its member ($1), identity ($3, $4) and attribute ($5,
// $6) locks.
const sqlFamUnstrand = `SELECT pg_catalog.pg_backend_pid(), CASE WHEN pg_catalog.pg_backend_pid() = $2::int4 THEN (
		SELECT pg_catalog.bool_and(v.ok) FROM (VALUES (pg_catalog.pg_advisory_unlock_shared($1::int8)),
			(pg_catalog.pg_advisory_unlock($3::int4, $4::int4)), (pg_catalog.pg_advisory_unlock_shared($5::int4, $6::int4))) AS v(ok)) END`

// famHold is what a handle of a family lock needs to release it.
type famHold struct {
	member   int64
	ik1, ik2 int32   // its identity lock
	ak1, ak2 int32   // its attribute lock
	channel  *string // a semaphore's notification channel; nil for a reader-writer lock
}

// unstrand gives back the participation on backend pid, where a pooler
// left it (see unstrand in wait.go).
func (f *famHold) unstrand(conn *pgxpool.Conn, pid uint32) bool {
	return unstrandWith(conn, pid, sqlFamUnstrand, f.member, int32(pid), f.ik1, f.ik2, f.ak1, f.ak2)
}

// famSpec is one acquisition of a family lock.
type famSpec struct {
	op      string
	code    int32 // famRW or famSem
	value   int32 // rwReader or rwWriter, or a semaphore's n
	member  int64
	gate    int64
	channel string // a semaphore's
}

// famDomains are the domains of the keys of the families (see famKey).
var famDomains = map[int32]string{famRW: "locker/v1/rw", famSem: "locker/v1/semaphore"}

// famKey returns the member lock's key (and the gate's) of key in a
// family: advisoryKey with the family's domain, and the same followed by
// "/gate", so that no two (family, prefix, key) share a key but by a hash
// collision, nor with a mutex's (AdvisoryKey's domain is "locker/v1").
func famKey(code int32, namespace, key string) (member, gate int64) {
	d := famDomains[code]
	return advisoryKey(d, namespace, key), advisoryKey(d+"/gate", namespace, key)
}

func (l *Locker) acquireFamily(ctx context.Context, op, key string, code int32, value int, wait bool, opts []locker.Option) (locker.Handle, error) {
	if code == famSem && (value < 1 || value > math.MaxInt32) {
		return nil, backend.KeyError(op, key, fmt.Errorf("%w: a semaphore's limit must be between 1 and %d, got %d", locker.ErrInvalidOption, math.MaxInt32, value))
	}
	member, gate := famKey(code, l.cfg.Prefix, key)
	sp := famSpec{op: op, code: code, value: int32(value), member: member, gate: gate}
	if code == famSem {
		sp.channel = fmt.Sprintf("locker_%016x", uint64(member))
	}
	return l.acquireWith(ctx, op, key, opts, func(ctx context.Context, conn *pgxpool.Conn, t terms) (grant, error) {
		return l.lockFamily(ctx, conn, sp, t, wait)
	})
}

// famState is a participant's place in the queue while it waits.
type famState struct {
	ticket int64
	target *int64 // whom it waits for; nil: a semaphore's first waiter
	before int64  // how many participants came before it
	admit  bool
	token  int64
	pid    uint32
	sent   time.Time // when the statement that admitted it was sent
}

// lockFamily registers a participant of sp's lock on conn and, when wait
// allows, waits until it is admitted. On success conn stays pinned; on
// every other outcome it has been given back (nothing left on its
// session) or destroyed.
func (l *Locker) lockFamily(ctx context.Context, conn *pgxpool.Conn, sp famSpec, t terms, wait bool) (grant, error) {
	var (
		admit       bool
		before      int64
		bad, target *int64
		ticket      *int64
		pid         int32
		old         []string
		set         *int64
	)
	sent := time.Now()
	err := conn.QueryRow(ctx, sqlFamRegister, sp.gate, sp.member, sp.code, sp.value, wait, l.cfg.sequence, t.names, t.values).
		Scan(&admit, &bad, &target, &before, &ticket, &pid, &old, &set)
	if err != nil {
		// Whether it registered is unknown: closing the session ends
		// whatever it took.
		destroy(conn)
		return grant{}, fmt.Errorf("joining the queue: %w", err)
	}
	if bad != nil {
		conn.Release() // nothing was taken
		return grant{}, fmt.Errorf("%w: the key is a semaphore of %d, asked for %d", locker.ErrLimitMismatch, *bad, sp.value)
	}
	if ticket == nil {
		conn.Release() // nothing was taken
		return grant{}, sp.notAcquired()
	}
	if *ticket >= 1<<62 {
		destroy(conn) // ends the participation
		return grant{}, fmt.Errorf("the token sequence %s handed out %d, beyond 2^62, which a lock family's ticket cannot encode", l.cfg.sequence, *ticket)
	}
	g := grant{id: sp.member, terms: t, old: old}
	ik1, ik2 := identityKey(*ticket)
	g.fam = &famHold{member: sp.member, ik1: ik1, ik2: ik2, ak1: int32(uint32(markAttr) | uint32(sp.code)), ak2: sp.value}
	if sp.code == famSem {
		g.fam.channel = &sp.channel
	}
	// The session that joined the queue is the one that must wait and
	// hold: a pooler that routes statements elsewhere is refused at once.
	regPID := uint32(pid)
	undo := func() bool { return g.fam.unstrand(conn, regPID) }
	if err := l.verifySession(ctx, conn, sp.member, regPID, undo); err != nil {
		destroy(conn)
		return grant{}, err
	}
	st := famState{ticket: *ticket, target: target, before: before, admit: admit, token: *ticket, pid: regPID, sent: sent}
	if !admit {
		st, err = l.famWait(ctx, conn, sp, t, st, old)
		if err != nil {
			return grant{}, err
		}
		if st.pid != regPID {
			if err := l.verifySession(ctx, conn, sp.member, st.pid, undo); err != nil {
				destroy(conn)
				return grant{}, err
			}
		}
	}
	g.token, g.pid, g.sent = st.token, st.pid, st.sent
	return g, nil
}

func (sp famSpec) notAcquired() error {
	switch {
	case sp.code == famSem:
		return fmt.Errorf("%w: all %d permits are held, or others wait for one", locker.ErrNotAcquired, sp.value)
	case sp.value == rwReader:
		return fmt.Errorf("%w: a writer holds it or waits for it", locker.ErrNotAcquired)
	default:
		return fmt.Errorf("%w: readers or a writer hold it, or wait for it", locker.ErrNotAcquired)
	}
}

// famWait waits until the registered participant st is admitted, in slices
// of t.period as the mutex's wait does (see waitSlice), except that at a
// slice's end it keeps its place: its ticket, not the server's lock queue,
// orders it. When ctx ends it leaves the queue (or, when that cannot be
// done cleanly, the connection is destroyed, which ends the session and
// its place with it).
func (l *Locker) famWait(ctx context.Context, conn *pgxpool.Conn, sp famSpec, t terms, st famState, old []string) (famState, error) {
	listening := false // LISTEN is in force on the session
	looked := false    // a step has looked at the queue since LISTEN
	for {
		// A semaphore's first waiter waits for a release's notification;
		// the second listens already, so that when the first is admitted
		// (which wakes it) it goes on to wait at once, without a LISTEN
		// and a look more in the way of the next admission (see famDecide).
		// A waiter looks at the queue after it listens, so that no release
		// falls between its look and its wait. No more than these two
		// listen.
		if sp.code == famSem && !listening && (st.target == nil || st.before == int64(sp.value)+1) {
			if err := l.quickExec(conn, t.period, "LISTEN "+pgx.Identifier{sp.channel}.Sanitize()); err != nil {
				destroy(conn)
				return st, fmt.Errorf("listening for released permits: %w", err)
			}
			listening, looked = true, false
		}
		unlisten := false
		if st.target == nil && looked {
			err := l.awaitNotification(ctx, conn, t.period)
			switch {
			case ctx.Err() != nil:
				return st, l.famLeave(ctx, conn, t, old, listening)
			case err != nil && !isTimeout(err):
				destroy(conn)
				return st, fmt.Errorf("waiting for a released permit: %w", err)
			}
			unlisten = err == nil // notified: most likely admitted now
		}
		out := l.runWait(ctx, conn.Conn().PgConn(), func(qctx context.Context) error {
			return l.famStep(qctx, conn, sp, t, &st, unlisten)
		})
		if out.err == nil && listening {
			looked = true
			listening = !unlisten
		}
		switch {
		case !out.interrupted && errors.Is(out.err, errSilent):
			destroy(conn)
			return st, out.err
		case !out.interrupted && isServerTimeout(out.err):
			continue // the slice ended: wait again, in the same place
		case !out.interrupted && out.err != nil:
			destroy(conn)
			return st, fmt.Errorf("waiting in the queue: %w", out.err)
		case !out.interrupted && st.admit:
			if listening {
				if err := l.quickExec(conn, t.period, "UNLISTEN *"); err != nil {
					destroy(conn)
					return st, fmt.Errorf("admitted, but could not stop listening: %w", err)
				}
			}
			return st, nil
		case !out.interrupted:
			continue
		case out.cancelAcked && isQueryCanceled(out.err):
			// The cancel ended the step (and was consumed by it): leave
			// the queue on the same session.
			return st, l.famLeave(ctx, conn, t, old, listening)
		default:
			// Admitted in the same instant as ctx ended, or the cancel
			// request may still be on its way: closing the session ends
			// the participation, whatever it is.
			destroy(conn)
		}
		return st, fmt.Errorf("waiting in the queue: %w", l.ctxErr(ctx))
	}
}

// famStep runs one step of a wait (sqlFamStep), at most one slice, with
// the same backstop as a slice of the mutex's wait (see waitSlice).
// With unlisten, it also ends the session's LISTEN, in the same round
// trip: the first waiter does so when a notification woke it, which most
// likely admits it, so that the permit it gets is not held up by an
// UNLISTEN of its own.
func (l *Locker) famStep(ctx context.Context, conn *pgxpool.Conn, sp famSpec, t terms, st *famState, unlisten bool) error {
	slice := t.period
	nc := conn.Conn().PgConn().Conn()
	backstop := l.sliceBackstop(slice, func() { _ = nc.Close() })
	var (
		admit         bool
		target, token *int64
		pid           int32
	)
	sent := time.Now()
	args := []any{lockTimeout(slice), st.target, sp.member, sp.code, sp.value, st.ticket, l.cfg.sequence}
	var err error
	if unlisten {
		// Sent together with the step, in one round trip: UNLISTEN takes
		// effect only if the step went through.
		b := &pgx.Batch{}
		b.Queue(sqlFamStep, args...)
		b.Queue("UNLISTEN *")
		br := conn.SendBatch(ctx, b)
		err = br.QueryRow().Scan(&admit, &target, &st.before, &token, &pid)
		if err == nil {
			_, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	} else {
		err = conn.QueryRow(ctx, sqlFamStep, args...).Scan(&admit, &target, &st.before, &token, &pid)
	}
	if !backstop.Stop() {
		return fmt.Errorf("%w: no answer within %v of a step of the wait with lock_timeout %v; the link seems dead, so the connection is closed, which ends the wait on the server (%v)",
			errSilent, 2*slice, slice, err)
	}
	if err != nil {
		return err
	}
	st.admit, st.target = admit, target
	if admit {
		if token == nil {
			return errors.New("admitted without a token")
		}
		st.token, st.pid, st.sent = *token, uint32(pid), sent
	}
	return nil
}

// awaitNotification waits, for at most d, for a notification on conn's
// session, as the health monitor waits on an idle session: a read
// deadline ends the wait and leaves the connection usable. ctx ending
// ends it too.
func (l *Locker) awaitNotification(ctx context.Context, conn *pgxpool.Conn, d time.Duration) error {
	nc := conn.Conn().PgConn().Conn()
	_ = nc.SetReadDeadline(time.Now().Add(d))
	woken := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(woken)
		_ = nc.SetReadDeadline(time.Now())
	})
	_, err := conn.Conn().WaitForNotification(context.Background())
	if !stop() {
		<-woken // the deadline it set must not outlive this wait
	}
	_ = nc.SetReadDeadline(time.Time{})
	return err
}

// quickExec runs a statement that takes a round trip, with a deadline of
// a slice and a grace, or until Close stops waiting for the calls in
// flight.
func (l *Locker) quickExec(conn *pgxpool.Conn, slice time.Duration, sql string) error {
	ctx, cancel := context.WithTimeout(l.life.Abandoned(), slice+cancelGrace)
	defer cancel()
	_, err := conn.Exec(ctx, sql)
	return err
}

// famLeave takes a waiter whose ctx ended out of the queue and gives the
// connection back, or destroys it when that fails; it returns the error
// of the abandoned wait.
func (l *Locker) famLeave(ctx context.Context, conn *pgxpool.Conn, t terms, old []string, listening bool) error {
	lctx, cancel := context.WithTimeout(l.life.Abandoned(), cancelGrace)
	defer cancel()
	var n int64
	err := conn.QueryRow(lctx, sqlFamLeave, t.names, old).Scan(&n)
	if err == nil && listening {
		_, err = conn.Exec(lctx, "UNLISTEN *")
	}
	if err != nil {
		destroy(conn)
	} else {
		conn.Release()
	}
	return fmt.Errorf("waiting in the queue: %w", l.ctxErr(ctx))
}

// SemaphoreKey returns the bigint advisory key that every holder and every
// waiter of the semaphore key (of the Locker prefix namespace) holds in
// share mode, for as long as it holds or waits: the sessions that pg_locks
// shows holding it are the semaphore's participants (see the package
// documentation, "Lock families"). It is AdvisoryKey with the domain
// "locker/v1/semaphore" in place of "locker/v1".
func SemaphoreKey(namespace, key string) int64 {
	m, _ := famKey(famSem, namespace, key)
	return m
}

// ReadWriteKey is SemaphoreKey for the reader-writer lock key: the domain
// is "locker/v1/rw".
func ReadWriteKey(namespace, key string) int64 {
	m, _ := famKey(famRW, namespace, key)
	return m
}
