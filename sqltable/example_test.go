package sqltable_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/sqltable"
)

// New builds a Locker on the application's own *sql.DB; the dialect comes
// from the driver, whose driver package the program imports:
//
//	import _ "github.com/go-locker/locker/sqltable/sqlite" // or sqltable/pgx, sqltable/mysql
//
// On SQLite, open the file with the DSN that sqlite.DSN returns (WAL,
// synchronous=NORMAL and a busy timeout on every connection): the Locker
// refuses connections that would flush to disk at every commit. The
// Locker does not close the database. (Runnable: the package example of
// sqltable/sqlite.)
func ExampleNew() {
	db, err := sql.Open("sqlite", "/var/lib/app/app.db?_pragma=busy_timeout(50)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close() // after the Locker's Close

	l := sqltable.New(db, sqltable.WithTable("app_locks"))
	defer l.Close()

	ctx := context.Background()
	err = locker.Do(ctx, l, "invoice/2026-11", func(ctx context.Context, h locker.Handle) error {
		// Only one process runs this at a time; ctx ends if the lock is lost.
		fmt.Println("holding", h.Key(), "with token", h.Token())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// Open takes a URL, here of a PostgreSQL lock table; the Locker owns its
// pool. The scheme's driver package must be imported:
//
//	import _ "github.com/go-locker/locker/sqltable/pgx"
func ExampleOpen() {
	ctx := context.Background()
	l, err := sqltable.Open(ctx, "postgres+table://app:secret@db.internal:5432/app?sslmode=verify-full")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()

	h, err := l.TryAcquire(ctx, "nightly-report")
	if err != nil {
		log.Fatal(err) // errors.Is(err, locker.ErrNotAcquired): another process runs it
	}
	defer h.Release(ctx)
}

// DDL gives the statements for users who create the tables themselves and
// then run Lockers with WithoutDDL: the lock table, the meta table and the
// families table (semaphores and reader-writer locks), with their versions.
func ExampleDDL() {
	stmts, err := sqltable.DDL(sqltable.MySQL, "locks")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(stmts), "statements; the first creates", "`locks`:", stmts[0][:35])
	// Output:
	// 5 statements; the first creates `locks`: CREATE TABLE IF NOT EXISTS `locks`
}
