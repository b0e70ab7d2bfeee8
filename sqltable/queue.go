package sqltable

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// The mutex's waiter queue: first come, first served across Lockers and
// processes (see "Fairness" in the package documentation).
//
// A waiter of a mutex key queues a row in the families table (family
// famMutexWait, kind 0, token 0), whose seq is taken from the key's queue:
// last + 1 (on PostgreSQL and MySQL, where two waiters may queue at once,
// at least the database's now in microseconds, so that they rarely take
// the same seq; the one that finds it taken takes the next). Its expires_us is the
// waiter's own lease (waitLease, as for the families' waiters), which it
// extends while it waits; a waiter that dies stops holding the queue back
// when that lease runs out. The acquire statement takes a free (or
// expired) row only when no live waiter row of the key has a lower seq
// than the caller's own (a caller that has not queued has none: any live
// waiter is ahead of it). The lock row stays the only truth for mutual
// exclusion and tokens: the queue only decides who may take a free row, so
// a waiter that queued a moment too late, or a process of an earlier
// release that does not look at the queue, costs fairness, never safety.
//
// The holder deletes its queue row right after its grant (with the rows of
// the key whose lease has run out); a waiter that gives up deletes its
// row and wakes the next waiter of the process.

// famMutexWait is the family of the mutex's waiter rows in the families
// table (beside famRW and famSem).
const famMutexWait = 3

// noSeq is the place of a caller that has not queued: behind every waiter.
const noSeq = math.MaxInt64

// queueStatements are the statements of the mutex's waiter queue, in the
// families table. Each takes the key as $1.
type queueStatements struct {
	// acquire is the lock table's acquire statement, which also takes the
	// caller's seq ($4): it takes a free or expired row only when no live
	// waiter row of the key is ahead of seq.
	acquire fstmt
	// enqueue queues a waiter row for owner ($2) with a lease of $3
	// microseconds and returns its seq (MySQL: the last insert ID; no row,
	// or 0 rows affected, when another row took the same seq at once).
	enqueue fstmt
	// dequeue deletes the row of owner ($2) and the key's rows whose lease
	// has run out.
	dequeue fstmt
	// extend extends the lease of the waiter row of owner ($2) and seq
	// ($4) to $3 microseconds if it has not run out.
	extend fstmt
	// remaining is the lock's remaining: the microseconds left of the
	// holder's lease or, when the row is free, until the first live
	// waiter row ahead of seq ($2) runs out (0 if none); no row when the
	// key has no row.
	remaining fstmt
}

// newQueueStatements writes the queue's statements of dialect d on table t
// (the lock table; the queue is in its families table).
func newQueueStatements(d Dialect, t tableName) queueStatements {
	tbl, fam := t.quoted(d, ""), t.quoted(d, famSuffix)
	now := nowMicros(d)
	clock := now
	if d == PostgreSQL {
		// The time the statement runs: seqs follow the order of the
		// inserts, not of their transactions' starts.
		clock = "(extract(epoch from clock_timestamp()) * 1000000)::bigint"
	}
	ahead := fmt.Sprintf(`SELECT 1 FROM %[1]s w WHERE w.family = %[2]d AND w.lock_key = $1 AND w.seq < $4 AND w.expires_us > %[3]s`, fam, famMutexWait, now)
	cols := "(family, lock_key, seq, owner, kind, lim, token, expires_us)"
	var q queueStatements
	switch d {
	case PostgreSQL:
		q.acquire = famStmt(d, fmt.Sprintf(`INSERT INTO %[1]s AS l (lock_key, owner, token, expires_us)
VALUES ($1, $2, %[2]s, %[2]s + $3)
ON CONFLICT (lock_key) DO UPDATE
SET owner = excluded.owner, token = GREATEST(l.token + 1, excluded.token), expires_us = excluded.expires_us
WHERE (l.expires_us <= excluded.token OR l.owner = '') AND NOT EXISTS (%[3]s)
RETURNING l.token`, tbl, now, ahead))
		q.enqueue = famStmt(d, fmt.Sprintf(`INSERT INTO %[1]s %[4]s
SELECT %[2]d, $1, GREATEST(COALESCE(MAX(seq), 0) + 1, %[3]s), $2, 0, 1, 0, %[3]s + $3 FROM %[1]s WHERE family = %[2]d AND lock_key = $1
ON CONFLICT DO NOTHING RETURNING seq`, fam, famMutexWait, clock, cols))
	case MySQL:
		// See newStatements for the assignments' order.
		q.acquire = famStmt(d, fmt.Sprintf(`INSERT INTO %[1]s (lock_key, owner, token, expires_us)
VALUES ($1, $2, LAST_INSERT_ID(%[2]s), %[2]s + $3)
ON DUPLICATE KEY UPDATE
owner = IF((expires_us <= %[2]s OR owner = '') AND NOT EXISTS (%[3]s), VALUES(owner), owner),
token = IF(owner = VALUES(owner), LAST_INSERT_ID(GREATEST(token + 1, VALUES(token))), token),
expires_us = IF(owner = VALUES(owner), VALUES(expires_us), expires_us)`, tbl, now, ahead))
		q.enqueue = famStmt(d, fmt.Sprintf(`INSERT IGNORE INTO %[1]s %[4]s
SELECT %[2]d, $1, LAST_INSERT_ID(GREATEST(COALESCE(MAX(seq), 0) + 1, %[3]s)), $2, 0, 1, 0, %[3]s + $3 FROM %[1]s WHERE family = %[2]d AND lock_key = $1`, fam, famMutexWait, clock, cols))
	case SQLite:
		q.acquire = famStmt(d, fmt.Sprintf(`INSERT INTO %[1]s AS l (lock_key, owner, token, expires_us)
VALUES ($1, $2, %[2]s, %[2]s + $3)
ON CONFLICT (lock_key) DO UPDATE
SET owner = excluded.owner, token = max(l.token + 1, excluded.token), expires_us = excluded.expires_us
WHERE (l.expires_us <= excluded.token OR l.owner = '') AND NOT EXISTS (%[3]s)
RETURNING token`, tbl, now, ahead))
		q.enqueue = famStmt(d, fmt.Sprintf(`INSERT INTO %[1]s %[4]s
SELECT %[2]d, $1, COALESCE(MAX(seq), 0) + 1, $2, 0, 1, 0, %[3]s + $3 FROM %[1]s WHERE family = %[2]d AND lock_key = $1
RETURNING seq`, fam, famMutexWait, clock, cols))
	}
	q.dequeue = famStmt(d, fmt.Sprintf(`DELETE FROM %[1]s WHERE family = %[2]d AND lock_key = $1 AND (owner = $2 OR expires_us <= %[3]s)`, fam, famMutexWait, now))
	q.extend = famStmt(d, fmt.Sprintf(`UPDATE %[1]s SET expires_us = %[3]s + $3
WHERE family = %[2]d AND lock_key = $1 AND owner = $2 AND seq = $4 AND expires_us > %[3]s`, fam, famMutexWait, now))
	q.remaining = famStmt(d, fmt.Sprintf(`SELECT CASE WHEN owner = '' OR expires_us <= %[3]s THEN
	COALESCE((SELECT MIN(w.expires_us) FROM %[2]s w WHERE w.family = %[4]d AND w.lock_key = $1 AND w.seq < $2 AND w.expires_us > %[3]s), %[3]s) - %[3]s
	ELSE expires_us - %[3]s END
FROM %[1]s WHERE lock_key = $1`, tbl, fam, now, famMutexWait))
	return q
}

// queuePrepared are the queue's statements, prepared by queueInit.
type queuePrepared struct {
	enqueue, dequeue, extend, remaining *sql.Stmt
}

func (p *queuePrepared) all() []**sql.Stmt {
	return []**sql.Stmt{&p.enqueue, &p.dequeue, &p.extend, &p.remaining}
}

// closeQueue closes the queue's prepared statements (Close).
func (l *Locker) closeQueue() error {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	return l.qp.close()
}

func (p *queuePrepared) close() error {
	var errs []error
	for _, st := range p.all() {
		if *st != nil {
			errs = append(errs, (*st).Close())
		}
	}
	return errors.Join(errs...)
}

// queueInit, from init (initSem held), decides whether the mutex queues
// its waiters: when the families table is there (made with the lock
// table, or added now unless WithoutDDL), it writes the queue's
// statements and makes the acquire statement the queue's (the others are
// prepared at the first wait, queuePrepare: a Locker that never waits
// does not pay for them). Without a
// families table (tables of an earlier release with WithoutDDL, or a role
// that may not create it) the mutex works as before, without the queue.
func (l *Locker) queueInit(ctx context.Context) error {
	fs := newFamStatements(l.dialect, l.table)
	var v string
	read := func() error {
		return l.retryIdem(ctx, func(ctx context.Context) error {
			return l.db.QueryRowContext(ctx, fs.version).Scan(&v)
		})
	}
	err := read()
	if errors.Is(err, sql.ErrNoRows) && !l.cfg.NoDDL {
		if l.runDDL(ctx, fs.ddl) == nil {
			err = read()
		}
	}
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil // no families table: no queue
	case err != nil:
		return fmt.Errorf("sqltable: read the families table's version from %s_meta: %w", l.table, err)
	}
	if n, err := strconv.Atoi(v); err != nil || n != FamiliesVersion {
		return nil // a layout this release does not know: no queue
	}
	qs := newQueueStatements(l.dialect, l.table)
	l.qs = qs
	if !l.queueAllowed(ctx) {
		return nil // a role without rights on the families table: no queue
	}
	l.st.acquire = qs.acquire.text
	l.queued = true
	return nil
}

// queuePrepare prepares the queue's statements, once per Locker.
func (l *Locker) queuePrepare(ctx context.Context) error {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	texts := []string{l.qs.enqueue.text, l.qs.dequeue.text, l.qs.extend.text, l.qs.remaining.text}
	for i, dst := range l.qp.all() {
		if *dst != nil {
			continue
		}
		if err := l.retryIdem(ctx, func(ctx context.Context) error {
			p, err := l.db.PrepareContext(ctx, texts[i])
			*dst = p
			return err
		}); err != nil {
			return fmt.Errorf("sqltable: prepare the waiter queue's statements: %w", err)
		}
	}
	return nil
}

// queueAllowed reports whether the Locker's role may use the queue's rows:
// a role given only the lock table and its meta table (see "The table")
// keeps its mutexes, unqueued. On MySQL the prepares check the rights
// (the statements are prepared now rather than at the first wait); on
// PostgreSQL, which checks them when a statement runs, one statement
// that touches no row does every kind of access the queue needs; SQLite
// has no rights.
func (l *Locker) queueAllowed(ctx context.Context) bool {
	switch l.dialect {
	case MySQL:
		if l.queuePrepare(ctx) != nil {
			return false
		}
		st, err := l.db.PrepareContext(ctx, l.qs.acquire.text)
		if err == nil {
			st.Close()
		}
		return err == nil
	case PostgreSQL:
		fam := l.table.quoted(l.dialect, famSuffix)
		probe := fmt.Sprintf(`WITH d AS (DELETE FROM %[1]s WHERE family = %[2]d AND lock_key = '' AND seq < 0 RETURNING 1),
u AS (UPDATE %[1]s SET expires_us = expires_us WHERE family = %[2]d AND lock_key = '' AND seq < 0 RETURNING 1),
i AS (INSERT INTO %[1]s SELECT * FROM %[1]s WHERE false RETURNING 1)
SELECT (SELECT count(*) FROM d) + (SELECT count(*) FROM u) + (SELECT count(*) FROM i)`, fam, famMutexWait)
		err := l.retryIdem(ctx, func(ctx context.Context) error {
			var n int64
			return l.db.QueryRowContext(ctx, probe).Scan(&n)
		})
		return err == nil
	}
	return true
}

// acquireArgs are the acquire statement's arguments for a caller whose
// place in the key's queue is seq (noSeq: not queued).
func (l *Locker) acquireArgs(key, owner string, ttl time.Duration, seq int64) []any {
	if !l.queued {
		return []any{key, owner, ttl.Microseconds()}
	}
	return l.qs.acquire.args(key, owner, ttl.Microseconds(), seq)
}

// enqueue queues a waiter row of key for owner with a lease of lease and
// returns its seq.
func (l *Locker) enqueue(ctx context.Context, key, owner string, lease time.Duration) (seq int64, err error) {
	if err := l.queuePrepare(ctx); err != nil {
		return 0, err
	}
	args := l.qs.enqueue.args(key, owner, lease.Microseconds())
	for {
		err = l.retry(ctx, func(ctx context.Context) error {
			if l.dialect == MySQL {
				res, err := l.qp.enqueue.ExecContext(ctx, args...)
				if err != nil {
					return err
				}
				if n, err := res.RowsAffected(); err != nil || n != 1 {
					seq = 0
					return err
				}
				seq, err = res.LastInsertId()
				return err
			}
			err := l.qp.enqueue.QueryRowContext(ctx, args...).Scan(&seq)
			if errors.Is(err, sql.ErrNoRows) {
				seq = 0
				return nil
			}
			return err
		})
		if err != nil || seq != 0 {
			return seq, err
		}
		// Another waiter took the same seq at the same moment: again.
	}
}

// dequeue deletes owner's waiter row of key (and the key's lapsed ones).
func (l *Locker) dequeue(ctx context.Context, key, owner string) error {
	if err := l.queuePrepare(ctx); err != nil {
		return err // (a Locker closed meanwhile: its lease ends the row)
	}
	_, err := l.affectedIdem(ctx, func(ctx context.Context) (sql.Result, error) {
		return l.qp.dequeue.ExecContext(ctx, l.qs.dequeue.args(key, owner)...)
	})
	return err
}

// dequeueBackground deletes owner's waiter row of key off the caller's
// path, bounded by the Locker's end and cleanupTimeout: a row left behind
// holds the queue back until its lease runs out.
func (l *Locker) dequeueBackground(key, owner string) {
	l.life.Go(func() {
		ctx, cancel := context.WithTimeout(l.endCtx, cleanupTimeout)
		defer cancel()
		_ = l.dequeue(ctx, key, owner)
	})
}

// extendWait extends owner's waiter row of key at seq; false when it had
// run out (or is gone): the waiter lost its place.
func (l *Locker) extendWait(ctx context.Context, key, owner string, seq int64, lease time.Duration) (bool, error) {
	n, err := l.affectedIdem(ctx, func(ctx context.Context) (sql.Result, error) {
		return l.qp.extend.ExecContext(ctx, l.qs.extend.args(key, owner, lease.Microseconds(), seq)...)
	})
	return n == 1, err
}

// queueRemaining is how long a waiter at seq has nothing to try for: the
// holder's remaining lease or, while the row is free, until the first live
// waiter ahead of it runs out; 0 when it may try now or the key has no row.
func (l *Locker) queueRemaining(ctx context.Context, key string, seq int64) (time.Duration, error) {
	var us int64
	err := l.retryIdem(ctx, func(ctx context.Context) error {
		err := l.qp.remaining.QueryRowContext(ctx, l.qs.remaining.args(key, seq)...).Scan(&us)
		if errors.Is(err, sql.ErrNoRows) {
			us = 0
			return nil
		}
		return err
	})
	return time.Duration(us) * time.Microsecond, err
}
