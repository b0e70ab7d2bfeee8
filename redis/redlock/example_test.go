package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/redis/redlock"
)

// The examples need Redis servers, so they are compiled but not run.

func ExampleNew() {
	var clients []goredis.UniversalClient
	for _, addr := range []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"} {
		c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
		defer c.Close() // after the Locker: New does not take the clients over
		clients = append(clients, c)
	}
	l := redlock.New(clients, redlock.WithDefaultTTL(10*time.Second))
	if err := l.Err(); err != nil {
		log.Fatal(err) // e.g. an even number of nodes
	}
	defer l.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h, err := l.Acquire(ctx, "invoice/42")
	if err != nil {
		log.Fatal(err)
	}
	defer h.Release(context.Background())

	// Redlock rests on timing assumptions: fence every write with the token.
	//   UPDATE invoices SET status = 'sent', fence = $1 WHERE id = 42 AND fence <= $1
	fmt.Println("token", h.Token())
}

func ExampleLocker_TryAcquire() {
	l, err := redlock.Open(context.Background(), "redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379?ttl=15s")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	h, err := l.TryAcquire(context.Background(), "cron/nightly-report")
	switch {
	case errors.Is(err, locker.ErrNotAcquired):
		return // another instance runs it
	case errors.Is(err, redlock.ErrNoQuorum):
		log.Fatal(err) // most nodes unreachable: an outage, not "someone else has it"
	case err != nil:
		log.Fatal(err)
	}
	defer h.Release(context.Background())
}

// A render farm of three slots shared by every instance: at most three
// renders run at once, whichever instances run them; the others wait their
// turn, first come, first served.
func ExampleLocker_AcquireSemaphore() {
	l, err := redlock.Open(context.Background(), "redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	farm := locker.Semaphore(l, 3) // every instance must say 3
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := farm.Acquire(ctx, "render-farm")
	if err != nil {
		log.Fatal(err) // ctx ended, no majority, or locker.ErrLimitMismatch
	}
	defer h.Release(context.Background())
	select {
	case <-h.Done(): // the permit was lost: stop rendering
	default:
		fmt.Println("rendering with permit", h.Token())
	}
}

// A configuration read by many and written by one: readers share the key,
// a writer waits for them to leave, and readers that come after a waiting
// writer wait behind it.
func ExampleLocker_AcquireRead() {
	l, err := redlock.Open(context.Background(), "redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()

	r, err := locker.ReadLock(l).Acquire(ctx, "config")
	if err != nil {
		log.Fatal(err)
	}
	// ... read the configuration; remember r.Token() ...
	_ = r.Release(ctx)

	w, err := locker.WriteLock(l).Acquire(ctx, "config")
	if err != nil {
		log.Fatal(err)
	}
	defer w.Release(ctx)
	// The writer's token is above every earlier reader's and writer's:
	//   UPDATE config SET body = $1, fence = $2 WHERE fence < $2
	fmt.Println("writing with token", w.Token())
}
