package sqltable

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// Prune deletes the rows of keys whose last lease ran out, or that were
// released, more than olderThan ago (at least MinPruneAge) and whose token
// is below the database's clock minus olderThan, so that a table of many
// short-lived keys does not grow without bound, and returns how many it
// deleted. Tokens of a pruned key keep increasing when it is taken again
// (see "Fencing tokens"). Prune never touches a held lock.
//
// It deletes in batches of at most 1000 rows (999 on MySQL), each a
// transaction of its own, and locks only the rows it deletes: PostgreSQL
// locks them as it picks them and skips rows that an acquire has locked;
// MySQL picks them with a read that locks nothing (its DELETE would lock
// every row it scans), in key order from where the last batch ended, then
// deletes them by key, checking the condition again; SQLite writes one
// transaction at a time anyway. Acquisitions go on between the batches.
// On MySQL, a proxy that sends reads to a lagging replica only makes
// Prune pick rows already gone; it deletes what qualifies on the primary,
// and goes through the table once. When ctx ends or a batch fails, it
// returns the rows deleted so far with the error.
func (l *Locker) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	if err := l.life.ConfigError(); err != nil {
		return 0, err
	}
	if olderThan < MinPruneAge {
		return 0, fmt.Errorf("%w: sqltable: Prune of rows older than %v: the least is %v", locker.ErrInvalidOption, olderThan, MinPruneAge)
	}
	// Life.Enter admits calls on a key; Prune has none: it is counted
	// (Begin) and tied to Close (callCtx) as Enter would do.
	if !l.life.Begin() {
		return 0, locker.ErrClosed
	}
	defer l.life.End()
	if ctx.Err() != nil {
		return 0, backend.ContextError(ctx)
	}
	cctx, cancel := l.callCtx(ctx)
	defer cancel()
	if err := l.init(cctx); err != nil {
		return 0, l.life.Why(cctx, err)
	}
	age := olderThan.Microseconds()
	batch := int64(pruneBatch)
	if l.dialect == MySQL {
		batch = pruneBatchMySQL
	}
	var (
		total int64
		after = []byte{} // MySQL: the last key of the last batch
	)
	for {
		var n, found int64
		var err error
		if l.dialect == MySQL {
			err = l.retryIdem(cctx, func(ctx context.Context) error {
				var err error
				var last []byte
				n, found, last, err = l.pruneMySQL(ctx, age, after, batch)
				if err == nil && last != nil {
					after = last
				}
				return err
			})
		} else {
			n, err = l.affected(cctx, func(ctx context.Context) (sql.Result, error) {
				return l.db.ExecContext(ctx, l.st.prune, age, batch)
			})
			found = n
		}
		total += n
		if err != nil {
			return total, l.life.Why(cctx, err)
		}
		if found < batch {
			return total, nil
		}
	}
}

// pruneMySQL runs one batch of Prune on MySQL (see statements.pruneKeys),
// on the keys after after: it returns the rows deleted, the candidates
// found and the last of them (nil when none was found).
func (l *Locker) pruneMySQL(ctx context.Context, age int64, after []byte, batch int64) (deleted, found int64, last []byte, err error) {
	rows, err := l.db.QueryContext(ctx, l.st.prune, age, age, after, batch)
	if err != nil {
		return 0, 0, nil, err
	}
	var keys []any
	for rows.Next() {
		var k []byte
		if err := rows.Scan(&k); err != nil {
			rows.Close()
			return 0, 0, nil, err
		}
		keys, last = append(keys, k), k
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return 0, 0, nil, err
	}
	if len(keys) == 0 {
		return 0, 0, nil, nil
	}
	marks := strings.Repeat("?, ", len(keys)-1) + "?"
	res, err := l.db.ExecContext(ctx, fmt.Sprintf(l.st.pruneKeys, marks), append(keys, age, age)...)
	if err != nil {
		return 0, int64(len(keys)), nil, err
	}
	deleted, err = res.RowsAffected()
	return deleted, int64(len(keys)), last, err
}

// pruneBatch is the most rows one statement of Prune deletes;
// pruneBatchMySQL on MySQL, whose IN list stays below MariaDB's
// in_predicate_conversion_threshold (1000), past which it may turn the
// list into a subquery.
const (
	pruneBatch      = 1000
	pruneBatchMySQL = 999
)
