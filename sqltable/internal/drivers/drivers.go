// Package drivers is the registry between package sqltable and its driver
// packages (sqltable/pgx, sqltable/mysql, sqltable/sqlite), as
// database/sql's is between it and its drivers: each driver package
// registers, from init, the URL schemes it opens and what the lock table
// needs to know of its driver (its database/sql driver type, its errors,
// and the driver-level calls behind the wake-ups). Package sqltable imports
// none of the drivers: a program links only those it imports.
//
// It is internal: the three driver packages are the only ones, and what
// they register may change with sqltable.
package drivers

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"sync"

	"github.com/go-locker/locker/backend"
)

// The dialects, numbered as sqltable.Dialect.
const (
	PostgreSQL = 1
	MySQL      = 2
	SQLite     = 3
)

// Module is the import path of the locker module, the driver packages'
// prefix.
const Module = "github.com/go-locker/locker"

// Packages are the import paths of the driver package of each dialect, for
// the "forgotten import?" errors.
var Packages = map[int]string{
	PostgreSQL: Module + "/sqltable/pgx",
	MySQL:      Module + "/sqltable/mysql",
	SQLite:     Module + "/sqltable/sqlite",
}

// DriverPackages are the Go packages of the database/sql drivers each
// dialect's driver package supports, by the package path of their driver
// type: New recognises a *sql.DB of a driver whose package was not imported
// and names the package to import.
var DriverPackages = map[string]int{
	"github.com/jackc/pgx/v5/stdlib": PostgreSQL,
	"github.com/go-sql-driver/mysql": MySQL,
	"modernc.org/sqlite":             SQLite,
}

// ErrNotOwn is returned by a driver-level call given a connection that is
// not its driver's (a wrapped driver): the Locker then goes through
// database/sql.
var ErrNotOwn = errors.New("sqltable: not the driver's own connection")

// Driver is what a driver package registers for its dialect. Func fields a
// driver does not need are nil.
type Driver struct {
	Dialect int
	Package string // the driver package's import path

	// Owns reports whether d is the database/sql driver of the dialect:
	// New detects the dialect of a *sql.DB by it.
	Owns func(d driver.Driver) bool

	// ParseURL reads the driver's own parameters of a URL of one of the
	// dialect's schemes from q (marking each as known, so that q.Finish
	// accepts them) and checks u; it returns the function that opens the
	// pool, called after the parameters of package sqltable have been
	// checked. Its errors wrap locker.ErrInvalidURL and never mention the
	// password.
	ParseURL func(u *url.URL, q *backend.Query) (open func() (*sql.DB, error), err error)

	// Transient reports a driver error after which the statement is known
	// not to have taken effect (busy, deadlock): the Locker runs it again.
	Transient func(err error) bool
	// ConnGone reports a driver error that says the connection was gone,
	// beyond the errors of database/sql, io and net that package sqltable
	// recognises itself.
	ConnGone func(err error) bool

	// PostgreSQL.

	// RaceLost reports the error of the loser of two CREATE ... IF NOT
	// EXISTS of one relation (see internal/pgrace).
	RaceLost func(err error) bool
	// QueryInt64 runs query on dc (a connection from sql.Conn.Raw) on the
	// driver itself, bypassing database/sql, and scans one int64; found is
	// false when there was no row. It returns ErrNotOwn when dc is not the
	// driver's connection.
	QueryInt64 func(ctx context.Context, dc any, query string, args ...any) (v int64, found bool, err error)
	// SafeToRetry reports an error of QueryInt64 after which nothing
	// reached the server and the connection broke.
	SafeToRetry func(err error) bool
	// Listen returns, from dc (a connection from sql.Conn.Raw, which it
	// does not keep), the listening session: listen opens a connection of
	// its own to the same server with dc's settings, outside database/sql's
	// pool, runs the statements of setup on it, calls ready, then hands the
	// payload of each notification to notify until ctx ends or the
	// connection fails, closes it and returns why it stopped. Listen
	// returns ErrNotOwn when dc is not the driver's connection.
	//
	// The session waits for hours, so it must not wait inside Conn.Raw:
	// Raw holds the pooled connection's lock, on which database/sql's
	// Result.RowsAffected of that connection's previous user waits (a
	// statement whose connection went back to the pool before its caller
	// read the count), and that call would wait as long.
	Listen func(dc any) (listen func(ctx context.Context, setup []string, ready func(), notify func(payload string)) error, err error)

	// SQLite.

	// JoinFileSignal registers a Locker of table (its wake-up identity) on
	// the database file dbFile and returns its membership of the file's
	// signal (see FileSignal); with watch, wake(table) is called for each
	// release that another Locker, of any process, signals on the file.
	JoinFileSignal func(dbFile, table string, watch bool, wake func(table string)) FileSignal
}

// FileSignal is a Locker's membership of the signal file beside an SQLite
// database (see package sqltable/sqlite): releases write it, and watching
// processes wake their waiters.
type FileSignal interface {
	// Signal tells the waiters of every process on the file that a lock
	// was freed.
	Signal()
	// Start starts watching the file unless this process already does,
	// and reports whether it does.
	Start(ctx context.Context) bool
	// Up reports whether this process watches the file now.
	Up() bool
	// Leave ends the membership; the last one on the file stops the watch.
	Leave()
}

var (
	mu      sync.RWMutex
	drivers = map[int]*Driver{}
)

// Register makes d the driver of its dialect. It panics when the dialect
// is registered twice: a programming error.
func Register(d *Driver) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := drivers[d.Dialect]; dup {
		panic(fmt.Sprintf("sqltable: driver of dialect %d registered twice", d.Dialect))
	}
	drivers[d.Dialect] = d
}

// Lookup returns the driver registered for dialect, or nil.
func Lookup(dialect int) *Driver {
	mu.RLock()
	defer mu.RUnlock()
	return drivers[dialect]
}

// Detect returns the registered driver that owns d, or nil.
func Detect(d driver.Driver) *Driver {
	mu.RLock()
	defer mu.RUnlock()
	for _, drv := range drivers {
		if drv.Owns != nil && drv.Owns(d) {
			return drv
		}
	}
	return nil
}

// Peek is a view of a Locker's insides for the tests of the driver
// packages, which cannot be tests of package sqltable: a test's imports
// reach the go.sum of every program that imports the package it tests, so
// package sqltable's tests import no driver, and those that need a real
// database (SQLite) live with the driver. Set by package sqltable; the
// arguments are its *Locker and *Handle.
var Peek struct {
	// HubKey returns the Locker's wake-up identity (valid after its first
	// call).
	HubKey func(l any) string
	// Watch registers a waiter of key on table in the process's wake-up
	// hub; woken receives its wake-ups; leave unregisters it.
	Watch func(table, key string) (woken <-chan struct{}, leave func())
	// Waiting reports whether a waiter of key on table is registered.
	Waiting func(table, key string) bool
	// Claimed reports whether a Release or Close has claimed the Handle.
	Claimed func(h any) bool
	// SetKeepHook sets the function an acquire runs between the
	// registration of its Handle and its return (nil: none).
	SetKeepHook func(f func(h any))
}
