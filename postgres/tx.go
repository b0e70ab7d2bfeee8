package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// Transaction-scoped locks (pg_advisory_xact_lock) belong to a transaction,
// not to a session: PostgreSQL releases them at COMMIT or ROLLBACK, and there
// is nothing to release by hand and no connection to pin. They therefore work
// behind transaction-mode poolers such as PgBouncer, where session locks do
// not. They share the key space (AdvisoryKey of the Locker's namespace) and
// the token sequence with the Locker's session locks, so the two kinds
// exclude each other and their tokens are ordered together.
const (
	sqlXactWait = `SELECT pg_catalog.nextval($2::text::regclass) FROM pg_catalog.pg_advisory_xact_lock($1)`
	sqlXactTry  = `SELECT CASE WHEN pg_catalog.pg_try_advisory_xact_lock($1) THEN pg_catalog.nextval($2::text::regclass) END`
)

// LockTx waits until key is held by tx and returns the fencing token of this
// acquisition. The lock lasts until tx commits or rolls back; it cannot be
// released earlier, and it cannot be lost while tx lives (if the connection
// dies, so does the transaction, and any write that relied on the lock is
// rolled back with it).
//
// When ctx ends first the wait is cancelled on the server and the error wraps
// ctx's error. The session's statement_timeout and lock_timeout also end the
// wait, with their error: the transaction is aborted by then, so LockTx
// cannot wait again. On any error tx must be rolled back: it is either
// aborted or holds a lock granted in the same instant.
//
// The lock belongs to the transaction or savepoint that is current when
// LockTx runs. Taken inside a savepoint (a nested pgx.Tx from tx.Begin, or
// an explicit SAVEPOINT), it ends at ROLLBACK TO SAVEPOINT (the nested Tx's
// Rollback), while the outer transaction goes on without it: writes made
// after that rollback are no longer protected. RELEASE SAVEPOINT (the nested
// Tx's Commit) hands it to the enclosing transaction. The server does not
// tell a savepoint from a transaction, so LockTx cannot refuse one: take
// the lock before the first savepoint, or end the transaction when you roll
// back to a savepoint taken before the lock.
//
// Unlike Acquire, LockTx waits in one piece (a slice's timeout would abort
// the transaction), so a cut-off link ends its wait only when ctx ends.
//
// The token sequence is checked (and created, unless WithoutDDL) through the
// Locker's pool, outside tx.
func (l *Locker) LockTx(ctx context.Context, tx pgx.Tx, key string) (token int64, err error) {
	return l.lockTx(ctx, "lock-tx", tx, key, true)
}

// TryLockTx makes one attempt to take key for the rest of tx; when another
// session or transaction holds it the error wraps locker.ErrNotAcquired, and
// tx remains usable.
func (l *Locker) TryLockTx(ctx context.Context, tx pgx.Tx, key string) (token int64, err error) {
	return l.lockTx(ctx, "try-lock-tx", tx, key, false)
}

func (l *Locker) lockTx(ctx context.Context, op string, tx pgx.Tx, key string, wait bool) (_ int64, err error) {
	ctx, done, err := l.life.Enter(ctx, op, key)
	if err != nil {
		return 0, err
	}
	defer done()
	defer func() { err = l.why(ctx, op, key, err) }()
	if tx == nil {
		return 0, backend.KeyError(op, key, fmt.Errorf("%w: nil pgx.Tx", locker.ErrInvalidOption))
	}

	if err := l.ensureSequence(ctx); err != nil {
		return 0, backend.KeyError(op, key, err)
	}
	id := AdvisoryKey(l.cfg.Prefix, key)
	if !wait {
		var token *int64
		if err := tx.QueryRow(ctx, sqlXactTry, id, l.cfg.sequence).Scan(&token); err != nil {
			return 0, backend.KeyError(op, key, fmt.Errorf("trying the lock: %w", err))
		}
		if token == nil {
			return 0, backend.KeyError(op, key, errNotAcquired)
		}
		return l.txToken(op, key, *token)
	}
	var token int64
	out := l.runWait(ctx, tx.Conn().PgConn(), func(qctx context.Context) error {
		return tx.QueryRow(qctx, sqlXactWait, id, l.cfg.sequence).Scan(&token)
	})
	if out.interrupted {
		return 0, backend.KeyError(op, key, fmt.Errorf("waiting for the lock (roll the transaction back): %w", l.ctxErr(ctx)))
	}
	if out.err != nil {
		return 0, backend.KeyError(op, key, fmt.Errorf("waiting for the lock: %w", out.err))
	}
	return l.txToken(op, key, token)
}

// txToken is the token of a transaction lock drawn from the sequence as
// native: plus the Locker's token base. An error (a sequence beyond 2^62)
// leaves the lock to the transaction, which the caller rolls back.
func (l *Locker) txToken(op, key string, native int64) (int64, error) {
	token, err := l.cfg.Token(native)
	if err != nil {
		return 0, backend.KeyError(op, key, fmt.Errorf("%w (roll the transaction back)", err))
	}
	return token, nil
}
