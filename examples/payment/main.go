// Command payment is the seeds' payment scenario as a small HTTP service:
// POST /orders/{id}/pay charges an order at most once, however many times
// the button is clicked, on however many instances of the service.
//
//	go run ./examples/payment -addr 127.0.0.1:8080
//	curl -X POST localhost:8080/orders/42/pay
//
// Three layers keep a charge from happening twice:
//
//  1. the lock payment/{id}, taken with TryDo: a second click while the
//     first is being charged gets 409 Conflict at once instead of waiting;
//  2. fenced writes: every write to the order carries the lock's fencing
//     token and is refused (fence <= token) once a newer holder has written,
//     so a holder that lost its lock without knowing (a paused process)
//     cannot overwrite a newer holder's work;
//  3. a UNIQUE idempotency key per order on the charge, which the payment
//     provider also receives: the last line of defence, as the seeds say.
//
// Locks and orders live in SQLite files by default (-locks, -db); -lock-url
// points the locks at any backend (redis://, postgres://, ...).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/examples/payment/shop"
	_ "github.com/go-locker/locker/postgres"
	_ "github.com/go-locker/locker/redis"
	_ "github.com/go-locker/locker/sqltable/mysql"  // mysql://
	_ "github.com/go-locker/locker/sqltable/pgx"    // postgres+table://
	_ "github.com/go-locker/locker/sqltable/sqlite" // sqlite: (the default here)
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	dir := flag.String("dir", ".", "directory of the SQLite files")
	lockURL := flag.String("lock-url", "", "lock backend URL (default: sqlite:DIR/locks.db)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := serve(ctx, *addr, *dir, *lockURL); err != nil {
		log.Fatal(err)
	}
}

func serve(ctx context.Context, addr, dir, lockURL string) error {
	if lockURL == "" {
		lockURL = "sqlite://" + filepath.Join(dir, "locks.db")
	}
	locks, err := locker.Open(ctx, lockURL)
	if err != nil {
		return err
	}
	defer locks.Close()
	db, err := shop.OpenDB(filepath.Join(dir, "payments.db"))
	if err != nil {
		return err
	}
	defer db.Close()
	s, err := shop.New(ctx, locks, db, shop.NewProvider())
	if err != nil {
		return err
	}
	srv := &http.Server{Addr: addr, Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	fmt.Printf("payment: listening on http://%s (POST /orders/{id}/pay)\n", addr)
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		return err
	}
	return nil
}
