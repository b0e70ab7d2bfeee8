package sqltable_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/sqltable"
)

// The tests of this package import no driver package: a test's imports
// reach the go.sum of every program that imports the package. The tests
// that need a database are in sqltable/sqlite (and, on servers, in the
// integration module).

func TestDDLErrors(t *testing.T) {
	if _, err := sqltable.DDL(sqltable.SQLite, "bad-name"); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("DDL with a bad name: %v", err)
	}
	if _, err := sqltable.DDL(sqltable.DialectAuto, "ok"); err == nil {
		t.Error("DDL without a dialect succeeded")
	}
	for _, d := range []sqltable.Dialect{sqltable.PostgreSQL, sqltable.MySQL, sqltable.SQLite} {
		stmts, err := sqltable.DDL(d, "app.locks")
		// The lock table, the meta table and its version; the families
		// table and its version.
		if err != nil || len(stmts) != 5 {
			t.Errorf("DDL(%v) = %d statements, %v", d, len(stmts), err)
		}
	}
}

// TestForgottenImport: without its driver package, a URL of a dialect
// fails with an error wrapping locker.ErrUnknownScheme that names the
// package to import, by locker.Open and by sqltable.Open; so does New for
// the dialect named by WithDialect.
func TestForgottenImport(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct{ url, pkg string }{
		{"sqlite:///tmp/locks.db", "github.com/go-locker/locker/sqltable/sqlite"},
		{"sqlite:locks.db?lock_table=x", "github.com/go-locker/locker/sqltable/sqlite"},
		{"mysql://u:p@127.0.0.1:1/db", "github.com/go-locker/locker/sqltable/mysql"},
		{"postgres+table://u:p@127.0.0.1:1/db", "github.com/go-locker/locker/sqltable/pgx"},
		{"POSTGRESQL+TABLE://u:p@127.0.0.1:1/db", "github.com/go-locker/locker/sqltable/pgx"},
	} {
		_, err := locker.Open(ctx, c.url)
		_, err2 := sqltable.Open(ctx, c.url)
		for _, err := range []error{err, err2} {
			if !errors.Is(err, locker.ErrUnknownScheme) || !strings.Contains(err.Error(), `import _ "`+c.pkg+`"`) || !strings.Contains(err.Error(), "forgotten import?") {
				t.Errorf("Open(%q) without its driver package = %v; want ErrUnknownScheme naming %s (forgotten import?)", c.url, err, c.pkg)
			}
		}
	}
	db := sql.OpenDB(noDriver{})
	defer db.Close()
	for d, pkg := range map[sqltable.Dialect]string{
		sqltable.SQLite:     "github.com/go-locker/locker/sqltable/sqlite",
		sqltable.MySQL:      "github.com/go-locker/locker/sqltable/mysql",
		sqltable.PostgreSQL: "github.com/go-locker/locker/sqltable/pgx",
	} {
		l := sqltable.New(db, sqltable.WithDialect(d))
		if err := l.Err(); !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), `import _ "`+pkg+`"`) {
			t.Errorf("New(WithDialect(%v)) without its driver package: Err() = %v; want ErrInvalidOption naming %s", d, err, pkg)
		}
		l.Close()
	}
	l := sqltable.New(db)
	defer l.Close()
	if err := l.Err(); !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), "WithDialect") {
		t.Errorf("New on a driver of no dialect: Err() = %v; want ErrInvalidOption suggesting WithDialect", err)
	}
}

// noDriver is a database/sql driver of no dialect; New never connects.
type noDriver struct{}

func (noDriver) Connect(context.Context) (driver.Conn, error) {
	return nil, errors.New("noDriver: no connections")
}
func (noDriver) Driver() driver.Driver { return noDriver{} }
func (noDriver) Open(string) (driver.Conn, error) {
	return nil, errors.New("noDriver: no connections")
}
