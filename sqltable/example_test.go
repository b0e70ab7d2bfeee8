package sqltable_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/sqltable"
)

// Open takes a URL; with SQLite the lock table lives in a file that every
// process of the host can open, and no server is needed.
func ExampleOpen() {
	dir, err := os.MkdirTemp("", "sqltable-example-*")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	ctx := context.Background()
	l, err := sqltable.Open(ctx, "sqlite://"+filepath.Join(dir, "locks.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()

	h, err := l.Acquire(ctx, "nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	// Another client (here, another Locker on the same file) cannot take it.
	other, err := sqltable.Open(ctx, "sqlite://"+filepath.Join(dir, "locks.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer other.Close()
	_, err = other.TryAcquire(ctx, "nightly-report")
	fmt.Println("second client:", errors.Is(err, locker.ErrNotAcquired))

	if err := h.Release(ctx); err != nil {
		log.Fatal(err)
	}
	h2, err := other.TryAcquire(ctx, "nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("after release, token increased:", h2.Token() > h.Token())
	_ = h2.Release(ctx)
	// Output:
	// second client: true
	// after release, token increased: true
}

// New builds a Locker on the application's own *sql.DB; the dialect comes
// from the driver. The Locker does not close the database.
func ExampleNew() {
	dir, err := os.MkdirTemp("", "sqltable-example-*")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	db, err := sql.Open("sqlite", filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close() // after the Locker's Close

	l := sqltable.New(db, sqltable.WithTable("app_locks"))
	defer l.Close()

	ctx := context.Background()
	err = locker.Do(ctx, l, "invoice/2026-11", func(ctx context.Context, h locker.Handle) error {
		// Only one process runs this at a time; ctx ends if the lock is lost.
		fmt.Println("holding", h.Key(), "in dialect", l.Dialect())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// holding invoice/2026-11 in dialect sqlite
}

// DDL gives the statements for users who create the tables themselves and
// then run Lockers with WithoutDDL.
func ExampleDDL() {
	stmts, err := sqltable.DDL(sqltable.MySQL, "locks")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(stmts), "statements; the first creates", "`locks`:", stmts[0][:35])
	// Output:
	// 3 statements; the first creates `locks`: CREATE TABLE IF NOT EXISTS `locks`
}
