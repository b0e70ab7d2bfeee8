package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	msqlite "modernc.org/sqlite"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/exiting"
)

// paramFileMode is the permissions of a database file that Open creates,
// octal.
const paramFileMode = "lock_file_mode"

// DefaultFileMode is the permission of an SQLite database file that
// sqltable.Open creates: readable and writable by its owner only, as the
// file says who holds what.
const DefaultFileMode = 0o600

// parseURL reads lock_file_mode; the returned function checks the file's
// directory, creates the file if needed and opens it with DSN.
func parseURL(u *url.URL, q *backend.Query) (func() (*sql.DB, error), error) {
	mode := DefaultFileMode
	if v, ok := q.Take(paramFileMode); ok {
		m, err := strconv.ParseUint(v, 8, 32)
		if err != nil || m > 0o777 || m&0o600 != 0o600 {
			return nil, fmt.Errorf("%w: sqlite: parameter %q: %q is not an octal file mode from 0600 to 0777 that lets its owner read and write", locker.ErrInvalidURL, paramFileMode, v)
		}
		mode = int(m)
	}
	return func() (*sql.DB, error) { return openSQLite(u, os.FileMode(mode)) }, nil
}

// sqlitePath returns the file of a sqlite: URL: sqlite:///abs/path.db,
// sqlite:/abs/path.db or sqlite:relative/path.db.
func sqlitePath(u *url.URL) (string, error) {
	var p string
	switch {
	case u.Opaque != "":
		var err error
		if p, err = url.PathUnescape(u.Opaque); err != nil {
			return "", fmt.Errorf("%w: sqlite: bad escape in the path", locker.ErrInvalidURL)
		}
	case u.Host != "":
		return "", fmt.Errorf("%w: sqlite: URL has a host %q; write sqlite:///absolute/path.db or sqlite:relative/path.db", locker.ErrInvalidURL, u.Host)
	default:
		p = u.Path
	}
	switch {
	case p == "":
		return "", fmt.Errorf("%w: sqlite: URL names no database file (want sqlite:///absolute/path.db or sqlite:relative/path.db)", locker.ErrInvalidURL)
	case p == ":memory:" || strings.HasPrefix(p, "file:") || strings.Contains(p, "mode=memory"):
		return "", fmt.Errorf("%w: %w: sqlite: %q: an in-memory database is private to one connection and cannot be shared; name a file", locker.ErrInvalidURL, locker.ErrUnsafeConfig, p)
	case strings.ContainsAny(p, "?#\x00"):
		return "", fmt.Errorf("%w: sqlite: the path %q contains '?', '#' or NUL, which the driver cannot take", locker.ErrInvalidURL, p)
	case strings.HasSuffix(p, "/"):
		return "", fmt.Errorf("%w: sqlite: the path %q names a directory, not a database file", locker.ErrInvalidURL, p)
	}
	return filepath.Clean(p), nil
}

// openSQLite checks the database file's directory, creates the file with
// mode if it is missing, and opens it in WAL mode with a busy timeout.
func openSQLite(u *url.URL, mode os.FileMode) (*sql.DB, error) {
	path, err := sqlitePath(u)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	switch {
	case os.IsNotExist(err):
		return nil, fmt.Errorf("sqltable: sqlite: the directory %q of the database file does not exist", dir)
	case err != nil:
		return nil, fmt.Errorf("sqltable: sqlite: the directory of the database file: %w", err)
	case !fi.IsDir():
		return nil, fmt.Errorf("sqltable: sqlite: %q, the directory of the database file, is not a directory", dir)
	}
	// SQLite needs to create the -wal and -shm files beside the database.
	probe, err := os.CreateTemp(dir, ".sqltable-probe-*")
	if err != nil {
		return nil, fmt.Errorf("sqltable: sqlite: the directory %q of the database file is not writable (SQLite creates its -wal and -shm files there): %w", dir, err)
	}
	probe.Close()
	os.Remove(probe.Name())
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, mode)
	switch {
	case err == nil:
		// Exactly mode, whatever the umask.
		cerr := f.Chmod(mode)
		f.Close()
		if cerr != nil {
			return nil, fmt.Errorf("sqltable: sqlite: set the mode of the new database file: %w", cerr)
		}
	case os.IsExist(err):
		fi, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("sqltable: sqlite: %w", err)
		}
		if fi.IsDir() {
			return nil, fmt.Errorf("sqltable: sqlite: %q is a directory, not a database file", path)
		}
	default:
		return nil, fmt.Errorf("sqltable: sqlite: create the database file: %w", err)
	}
	return sql.OpenDB(keepWAL{dsn: DSN(path) + "&_pragma=journal_size_limit(0)", path: path}), nil
}

// keepWAL opens the connections of a URL's pool with the -wal and -shm
// files kept when the last connection closes (SQLITE_FCNTL_PERSIST_WAL),
// emptied (journal_size_limit 0) rather than deleted: the next process to
// open the database does not create the WAL again. A locker run on the
// default opens and closes the database once per run. The files stay
// beside the database, as they do while any process has it open.
//
// When the process is exiting (internal/exiting: the locker command,
// after its lock was released) and the WAL is smaller than exitWALMax, the
// connections are left open for the process's end to close (exitConn): a
// last connection's close checkpoints the WAL into the database (two disk
// syncs) and the next process's first write starts the WAL again (two
// more: its header and the directory), while a process's end is what
// SQLite recovers from by design: the next process to open the database
// reads the WAL back (BenchmarkExitRecovery: 0.35 ms more for a WAL of
// 286 KiB, 0.6 ms for 463 KiB, where the four syncs took 3 to 4 ms on an
// idle disk and up to 20 ms on a busy one). The WAL is checkpointed by the
// first process that exits with exitWALMax or more in it, or by a process
// that closes its Locker without exiting.
type keepWAL struct {
	dsn  string
	path string // the database file
}

func (c keepWAL) Connect(context.Context) (driver.Conn, error) {
	conn, err := (&msqlite.Driver{}).Open(c.dsn)
	if err != nil {
		return nil, err
	}
	if fc, ok := conn.(msqlite.FileControl); ok {
		_, _ = fc.FileControlPersistWAL("main", 1)
	}
	if fc, ok := conn.(fullConn); ok {
		return &exitConn{fullConn: fc, wal: c.path + "-wal"}, nil
	}
	return conn, nil
}

func (keepWAL) Driver() driver.Driver { return &msqlite.Driver{} }

// exitWALMax is the largest WAL that an exiting process leaves for the
// next one to recover rather than checkpoint: a locker run adds two
// frames (about 8 KiB), so about one run in 60 checkpoints, and the
// recovery of a WAL this size costs well under a disk sync.
const exitWALMax = 512 << 10

// fullConn is what database/sql uses of modernc.org/sqlite's connections.
type fullConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
}

// exitConn is a URL pool's connection: its Close leaves it open when the
// process is exiting and the WAL is small (see keepWAL).
type exitConn struct {
	fullConn
	wal string
}

func (c *exitConn) Close() error {
	if exiting.Now() {
		if fi, err := os.Stat(c.wal); err == nil && fi.Size() < exitWALMax {
			return nil
		}
	}
	return c.fullConn.Close()
}
