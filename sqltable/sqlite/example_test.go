package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

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

// A render farm limited to 3 jobs at once: each worker takes one of the 3
// permits of the semaphore "render-farm" (locker.Semaphore makes it a
// Locker, so Do works on it); a fourth waits until a permit is free. Every
// permit has a fencing token of its own, above every permit's before it.
func Example_semaphore() {
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

	farm := locker.Semaphore(l, 3)
	var jobs []locker.Handle
	for range 3 {
		h, err := farm.TryAcquire(ctx, "render-farm")
		if err != nil {
			log.Fatal(err)
		}
		jobs = append(jobs, h)
	}
	_, err = farm.TryAcquire(ctx, "render-farm")
	fmt.Println("a fourth job while three render:", errors.Is(err, locker.ErrNotAcquired))

	// A fourth worker waits; the first job's end lets it in.
	next := make(chan locker.Handle)
	go func() {
		h, err := farm.Acquire(ctx, "render-farm")
		if err != nil {
			log.Fatal(err)
		}
		next <- h
	}()
	if err := jobs[0].Release(ctx); err != nil {
		log.Fatal(err)
	}
	h := <-next
	fmt.Println("the fourth job's token is above the others':", h.Token() > jobs[2].Token())
	_ = h.Release(ctx)
	for _, j := range jobs[1:] {
		_ = j.Release(ctx)
	}

	// A holder asking for another limit is refused, never obeyed.
	h, _ = farm.TryAcquire(ctx, "render-farm")
	_, err = locker.Semaphore(l, 5).TryAcquire(ctx, "render-farm")
	fmt.Println("a limit of 5 on a semaphore of 3:", errors.Is(err, locker.ErrLimitMismatch))
	_ = h.Release(ctx)
	// Output:
	// a fourth job while three render: true
	// the fourth job's token is above the others': true
	// a limit of 5 on a semaphore of 3: true
}

// A config read by many and written by one: readers share the key "config",
// a writer has it alone. A writer that waits is not overtaken by readers
// that come after it (first come, first served), and its token is above
// every reader's before it, so a store fenced by tokens refuses a stale
// write.
func Example_readWrite() {
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

	r1, err := l.AcquireRead(ctx, "config")
	if err != nil {
		log.Fatal(err)
	}
	r2, err := l.AcquireRead(ctx, "config")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("two readers at once")

	written := make(chan locker.Handle)
	go func() {
		w, err := l.AcquireWrite(ctx, "config") // waits for both readers
		if err != nil {
			log.Fatal(err)
		}
		written <- w
	}()
	// Wait until the writer is queued: then a new reader must wait behind it.
	for {
		r, err := l.TryAcquireRead(ctx, "config")
		if errors.Is(err, locker.ErrNotAcquired) {
			break
		} else if err != nil {
			log.Fatal(err)
		}
		_ = r.Release(ctx) // taken before the writer queued
		time.Sleep(time.Millisecond)
	}
	fmt.Println("a reader after the waiting writer: not now")

	_ = r1.Release(ctx)
	_ = r2.Release(ctx)
	w := <-written
	fmt.Println("the writer's token is above the readers':", w.Token() > r2.Token())
	_ = w.Release(ctx)
	// Output:
	// two readers at once
	// a reader after the waiting writer: not now
	// the writer's token is above the readers': true
}
