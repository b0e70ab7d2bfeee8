package chaos

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"slices"

	_ "modernc.org/sqlite" // the register is an SQLite row per key
)

// register is the shared resource the workers write to under the lock: an
// SQLite database in the run's directory. For the mutex it is one row per
// key holding the highest fencing token that wrote and the value it wrote;
// a write whose token is lower than the row's is rejected, in the same
// statement, as a storage service that checks fencing tokens does (the
// seeds' "fencing" section). The families have registers of their own
// (semWrite, rwWrite, rwRead below). Every worker process opens the same
// file.
type register struct{ db *sql.DB }

const registerSchema = `CREATE TABLE IF NOT EXISTS register (
	key   TEXT PRIMARY KEY,
	fence INTEGER NOT NULL,
	value INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sem_writers (
	key   TEXT NOT NULL,
	token INTEGER NOT NULL,
	value INTEGER NOT NULL,
	PRIMARY KEY (key, token)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sem_floor (
	key   TEXT PRIMARY KEY,
	floor INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rw_register (
	key    TEXT PRIMARY KEY,
	wfence INTEGER NOT NULL,
	rfence INTEGER NOT NULL,
	value  INTEGER NOT NULL
) WITHOUT ROWID`

func openRegister(path string) (*register, error) {
	// A worker may be stopped (SIGSTOP) in the middle of a write and keep
	// the database's write lock meanwhile: the others wait for it rather
	// than fail at once.
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() + "?_pragma=busy_timeout(60000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("chaos: open the register %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(registerSchema); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("chaos: create the register's table in %s: %w", path, err)
	}
	return &register{db: db}, nil
}

func (r *register) close() error { return r.db.Close() }

// write stores value under key if token is at least the highest token that
// wrote the key so far, and reports whether it did.
func (r *register) write(ctx context.Context, key string, token, value int64) (bool, error) {
	res, err := r.db.ExecContext(ctx, `INSERT INTO register (key, fence, value) VALUES (?1, ?2, ?3)
		ON CONFLICT (key) DO UPDATE SET fence = excluded.fence, value = excluded.value
		WHERE excluded.fence >= register.fence`, key, token, value)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	return n == 1, nil
}

// read returns the key's fence and value (zeros when never written).
func (r *register) read(ctx context.Context, key string) (fence, value int64, err error) {
	err = r.db.QueryRowContext(ctx, `SELECT fence, value FROM register WHERE key = ?1`, key).Scan(&fence, &value)
	if err == sql.ErrNoRows {
		return 0, 0, nil
	}
	return fence, value, err
}

// semResult is what the semaphore register did with a write.
type semResult struct {
	ok      bool
	evicted int64   // accepted in place of this writer, which is cut off for good; 0: none
	full    []int64 // the n writers (tokens, ascending) it found when n were writing; nil when fewer were
	floor   int64   // refused for being at or below this floor (a writer cut off before); 0: not so
}

// semWrite is the fenced write of a semaphore of n: the register keeps, per
// key, the writers (tokens) that have written and not yet left (semLeave),
// at most n of them, and a floor. A write with token t
//   - is accepted when t is one of the writers;
//   - is refused when t is at or below the floor;
//   - is accepted, t joining the writers, when fewer than n are writing;
//   - else n+1 claim the register at once, so one of them has lost its
//     permit: the lowest token of the n+1 is cut off for good (the floor
//     rises to it): if that is t the write is refused, else the lowest
//     writer leaves the writers, t joins them and the write is accepted.
//
// So never more than n writers write at once, and a writer cut off, or any
// lower token that was not writing, is refused from then on. The register
// sees tokens only, so it cannot tell which of n+1 claimants lost its
// permit: a live holder can be cut off in place of a stale one with a higher
// token. For n = 1 it is the mutex register, with holders that leave.
func (r *register) semWrite(ctx context.Context, key string, n int, token, value int64) (res semResult, err error) {
	tx, err := r.db.BeginTx(ctx, nil) // BEGIN IMMEDIATE (_txlock): one writer at a time
	if err != nil {
		return res, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	rows, err := tx.QueryContext(ctx, `SELECT token FROM sem_writers WHERE key = ?1 ORDER BY token`, key)
	if err != nil {
		return res, err
	}
	var writers []int64
	for rows.Next() {
		var t int64
		if err = rows.Scan(&t); err != nil {
			_ = rows.Close()
			return res, err
		}
		writers = append(writers, t)
	}
	if err = rows.Close(); err != nil {
		return res, err
	}
	var floor int64
	if err = tx.QueryRowContext(ctx, `SELECT floor FROM sem_floor WHERE key = ?1`, key).Scan(&floor); err != nil && err != sql.ErrNoRows {
		return res, err
	}
	setFloor := func(f int64) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO sem_floor (key, floor) VALUES (?1, ?2)
			ON CONFLICT (key) DO UPDATE SET floor = max(floor, excluded.floor)`, key, f)
		return err
	}
	switch {
	case slices.Contains(writers, token):
		_, err = tx.ExecContext(ctx, `UPDATE sem_writers SET value = ?3 WHERE key = ?1 AND token = ?2`, key, token, value)
		res.ok = true
	case token <= floor:
		res.floor = floor
	case len(writers) < n:
		_, err = tx.ExecContext(ctx, `INSERT INTO sem_writers (key, token, value) VALUES (?1, ?2, ?3)`, key, token, value)
		res.ok = true
	case token < writers[0]:
		res.full = writers
		err = setFloor(token)
	default:
		res.full, res.evicted, res.ok = writers, writers[0], true
		if _, err = tx.ExecContext(ctx, `DELETE FROM sem_writers WHERE key = ?1 AND token = ?2`, key, writers[0]); err != nil {
			return semResult{}, err
		}
		if _, err = tx.ExecContext(ctx, `INSERT INTO sem_writers (key, token, value) VALUES (?1, ?2, ?3)`, key, token, value); err != nil {
			return semResult{}, err
		}
		err = setFloor(writers[0])
	}
	if err != nil {
		return semResult{}, err
	}
	if err = tx.Commit(); err != nil {
		return semResult{}, err
	}
	return res, nil
}

// semLeave takes token out of key's writers: its holder is done writing
// (it leaves before it releases its permit).
func (r *register) semLeave(ctx context.Context, key string, token int64) error {
	_, err := r.db.ExecContext(ctx, `DELETE FROM sem_writers WHERE key = ?1 AND token = ?2`, key, token)
	return err
}

// rwWrite is the fenced write of a reader-writer lock's writer: accepted
// when token is at least the highest token that wrote (wfence) and the
// highest token that read (rfence), in one statement. A writer older than a
// read already served is refused: readers and writers draw their tokens
// from one sequence, and a reader granted after the writer means the writer
// had lost its lock by then.
func (r *register) rwWrite(ctx context.Context, key string, token, value int64) (bool, error) {
	res, err := r.db.ExecContext(ctx, `INSERT INTO rw_register (key, wfence, rfence, value) VALUES (?1, ?2, 0, ?3)
		ON CONFLICT (key) DO UPDATE SET wfence = excluded.wfence, value = excluded.value
		WHERE excluded.wfence >= rw_register.wfence AND excluded.wfence >= rw_register.rfence`, key, token, value)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	return n == 1, nil
}

// rwRead is the fenced read of a reader (or of a writer, after its writes):
// served when no writer with a token above token has written, raising
// rfence to token, and then it returns the token that wrote the value
// (wfence) and the value (zeros when never written). A reader older than
// the last writer is refused: that writer was granted after the reader, so
// the reader had lost its lock by then, and what it would read is not what
// its lock protected.
func (r *register) rwRead(ctx context.Context, key string, token int64) (ok bool, fence, value int64, err error) {
	err = r.db.QueryRowContext(ctx, `INSERT INTO rw_register (key, wfence, rfence, value) VALUES (?1, 0, ?2, 0)
		ON CONFLICT (key) DO UPDATE SET rfence = max(rw_register.rfence, excluded.rfence)
		WHERE rw_register.wfence <= excluded.rfence
		RETURNING wfence, value`, key, token).Scan(&fence, &value)
	if err == sql.ErrNoRows {
		return false, 0, 0, nil
	}
	if err != nil {
		return false, 0, 0, err
	}
	return true, fence, value, nil
}
