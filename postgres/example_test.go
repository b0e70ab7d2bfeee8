package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/postgres"
)

// These examples need a PostgreSQL server, so they are compiled but not run
// (they have no Output comment).

// New builds a Locker on the application's own pool. Size the pool for the
// locks held at once: each pins a connection.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal:5432/app?pool_max_conns=20")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close() // after the Locker's Close: the pool waits for pinned connections

	l := postgres.New(pool, postgres.WithPrefix("billing"))
	defer l.Close()

	err = locker.Do(ctx, l, "nightly-report", func(ctx context.Context, _ locker.Handle) error {
		// Only one instance runs this at a time. ctx ends if the lock is lost.
		return nil
	})
	if err != nil {
		log.Print(err)
	}
}

// TryAcquire turns a duplicate request into an HTTP 409 instead of a second
// payment. The token fences the write: the UPDATE only succeeds for a token
// higher than the last one the row saw.
func ExampleLocker_TryAcquire() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	l := postgres.New(pool)
	defer l.Close()

	pay := func(w http.ResponseWriter, r *http.Request, orderID int64) {
		h, err := l.TryAcquire(r.Context(), fmt.Sprintf("order/%d/payment", orderID))
		if errors.Is(err, locker.ErrNotAcquired) {
			http.Error(w, "payment already in progress", http.StatusConflict)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer h.Release(context.WithoutCancel(r.Context()))
		tag, err := pool.Exec(r.Context(),
			`UPDATE orders SET paid = true, fence = $2 WHERE id = $1 AND fence <= $2 AND NOT paid`,
			orderID, h.Token())
		if err != nil || tag.RowsAffected() == 0 {
			http.Error(w, "not paid", http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
	_ = pay
}

// Open takes the pool settings and the Locker's own options from one URL; the
// Locker owns that pool and closes it.
func Example_open() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := locker.Open(ctx,
		"postgres://app:secret@db.internal:5432/app?sslmode=require&pool_max_conns=10&prefix=cron&lock_health_interval=2s")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()

	h, err := l.Acquire(ctx, "cleanup")
	if err != nil {
		log.Fatal(err)
	}
	defer h.Release(context.Background())
	select {
	case <-h.Done():
		log.Printf("lost the lock: %v", h.Err())
	case <-time.After(time.Second): // the work
	}
}

// LockTx takes a transaction-scoped lock, which also works behind PgBouncer in
// transaction mode; COMMIT or ROLLBACK releases it.
func ExampleLocker_LockTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@pgbouncer.internal:6432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	l := postgres.New(pool)
	defer l.Close()

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	token, err := l.LockTx(ctx, tx, "inventory/sku-42")
	if err != nil {
		log.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE stock SET n = n - 1, fence = $1 WHERE sku = 'sku-42' AND n > 0`, token); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}

// A render farm of any number of workers renders at most three frames at
// once: each frame holds one of the 3 permits of the semaphore "render-farm"
// while it renders. Permits go to the waiting workers in the order they
// came; a worker that dies gives its permit back when its session ends.
func ExampleLocker_AcquireSemaphore() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal:5432/app?pool_max_conns=20")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	l := postgres.New(pool)
	defer l.Close()

	render := func(frame int) error {
		// locker.Semaphore(l, 3) is a Locker whose Acquire takes a permit:
		// Do holds it for the function and releases it after.
		return locker.Do(ctx, locker.Semaphore(l, 3), "render-farm", func(ctx context.Context, h locker.Handle) error {
			log.Printf("rendering frame %d with permit %d", frame, h.Token())
			return nil // ctx ends if the permit is lost
		})
	}
	for frame := range 10 {
		go func() {
			if err := render(frame); err != nil {
				log.Print(err)
			}
		}()
	}
}

// A configuration read by many and written by one: readers share the read
// lock, a writer waits for the readers before it and keeps out those that
// come after it (first come, first served: readers never starve a writer).
// The writer's token fences its UPDATE: a writer that lost its lock, and
// whose token is older than the last one the row saw, writes nothing.
func ExampleLocker_AcquireWrite() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	l := postgres.New(pool)
	defer l.Close()

	read := func() (string, error) {
		var body string
		err := locker.Do(ctx, locker.ReadLock(l), "config", func(ctx context.Context, _ locker.Handle) error {
			return pool.QueryRow(ctx, `SELECT body FROM config WHERE name = 'app'`).Scan(&body)
		})
		return body, err
	}
	write := func(body string) error {
		h, err := l.AcquireWrite(ctx, "config")
		if err != nil {
			return err
		}
		defer h.Release(context.Background())
		_, err = pool.Exec(ctx, `UPDATE config SET body = $1, fence = $2 WHERE name = 'app' AND fence < $2`, body, h.Token())
		return err
	}
	if err := write("v2"); err != nil {
		log.Fatal(err)
	}
	body, err := read()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(body)
}
