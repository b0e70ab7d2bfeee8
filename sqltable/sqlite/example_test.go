package sqlite_test

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
	"github.com/go-locker/locker/sqltable/sqlite"
)

// A lock table in an SQLite file on the application's own *sql.DB, opened
// with DSN: the lock table's settings on every connection of the pool.
// Every process of the host that opens the file shares the locks; no
// server is needed.
func Example() {
	dir, err := os.MkdirTemp("", "sqltable-example-*")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	db, err := sql.Open("sqlite", sqlite.DSN(filepath.Join(dir, "app.db")))
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

// By URL, the Locker opens (and closes) its own pool, with the same
// settings, and creates the file if it is missing.
func Example_uRL() {
	dir, err := os.MkdirTemp("", "sqltable-example-*")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	ctx := context.Background()
	l, err := locker.Open(ctx, "sqlite://"+filepath.Join(dir, "locks.db"))
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
