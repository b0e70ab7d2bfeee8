package chaos

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"

	_ "modernc.org/sqlite" // the register is an SQLite row per key
)

// register is the shared resource the workers write to under the lock: an
// SQLite database in the run's directory, with one row per key holding the
// highest fencing token that wrote and the value it wrote. A write whose
// token is lower than the row's is rejected, in the same statement, as a
// storage service that checks fencing tokens does (the seeds' "fencing"
// section). Every worker process opens the same file.
type register struct{ db *sql.DB }

const registerSchema = `CREATE TABLE IF NOT EXISTS register (
	key   TEXT PRIMARY KEY,
	fence INTEGER NOT NULL,
	value INTEGER NOT NULL
) WITHOUT ROWID`

func openRegister(path string) (*register, error) {
	// A worker may be stopped (SIGSTOP) in the middle of a write and keep
	// the database's write lock meanwhile: the others wait for it rather
	// than fail at once.
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() + "?_pragma=busy_timeout(60000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
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
