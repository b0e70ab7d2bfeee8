// Package sqlite is the SQLite driver package of sqltable: imported, it
// lets sqltable.New take a *sql.DB of modernc.org/sqlite (pure Go, no cgo),
// and sqltable.Open and locker.Open take sqlite: URLs:
//
//	import _ "github.com/go-locker/locker/sqltable/sqlite"
//
// It links modernc.org/sqlite (which registers the database/sql driver
// "sqlite") and github.com/fsnotify/fsnotify, which watches the signal
// file through which a release wakes the waiters of other processes (see
// "Waiting" in package sqltable).
//
// On your own *sql.DB, open the file with DSN, which sets what the lock
// table needs on every connection of the pool (see "SQLite" in package
// sqltable for why, and what New refuses):
//
//	db, err := sql.Open("sqlite", sqlite.DSN("/var/lib/app/locks.db"))
//	l := sqltable.New(db)
package sqlite

import (
	"database/sql/driver"
	"errors"
	"strconv"

	msqlite "modernc.org/sqlite"

	// The package's URL schemes are registered with locker.Open by
	// sqltable: importing this package alone makes them work.
	_ "github.com/go-locker/locker/sqltable"
	"github.com/go-locker/locker/sqltable/internal/drivers"
)

func init() {
	drivers.Register(&drivers.Driver{
		Dialect:        drivers.SQLite,
		Package:        drivers.Packages[drivers.SQLite],
		Owns:           owns,
		ParseURL:       parseURL,
		Transient:      transient,
		JoinFileSignal: joinFileSignal,
	})
}

func owns(d driver.Driver) bool {
	_, ok := d.(*msqlite.Driver)
	return ok
}

// BusyTimeout is the busy timeout, in milliseconds, that DSN and sqlite:
// URLs set: how long SQLite itself waits for another writer before it
// returns SQLITE_BUSY, which the Locker then retries within the caller's
// context (with a back-off of 1 to 50ms). A cancelled context interrupts
// either wait.
const BusyTimeout = 50

// DSN returns the modernc.org/sqlite data source name of the database file
// path with what the lock table needs on every connection: WAL journal
// mode, synchronous=NORMAL and a busy timeout of BusyTimeout:
//
//	path?_pragma=busy_timeout(50)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)
//
// The path must not contain '?'. Other _pragma parameters may be appended.
func DSN(path string) string {
	return path + "?_pragma=busy_timeout(" + strconv.Itoa(BusyTimeout) + ")&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
}

// transient reports SQLite's busy and locked databases (another connection
// or process writes): the statement did not run.
func transient(err error) bool {
	var se *msqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case 5, 6: // SQLITE_BUSY, SQLITE_LOCKED
			return true
		}
	}
	return false
}
