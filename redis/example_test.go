package redis_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/redis"
)

// The examples need a Redis server, so they are compiled but not run.

func ExampleNew() {
	client := goredis.NewClient(&goredis.Options{
		Addr: "127.0.0.1:6379",
		// Lets a context's deadline end a request on the socket too, not
		// only the call waiting for it.
		ContextTimeoutEnabled: true,
	})
	defer client.Close() // after the Locker: New does not take the client over

	l := redis.New(client, redis.WithDefaultTTL(10*time.Second))
	defer l.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h, err := l.Acquire(ctx, "invoice/42")
	if err != nil {
		log.Fatal(err)
	}
	defer h.Release(context.Background())

	// Hand the fencing token to the resource so that it can turn away a
	// holder that lost the lock without noticing (paused, partitioned):
	//   UPDATE invoices SET status = 'sent', fence = $1 WHERE id = 42 AND fence <= $1
	fmt.Println("holding invoice/42 with token", h.Token())

	select {
	case <-h.Done(): // the watchdog could not keep the lock: stop working
		log.Print(h.Err())
	default:
	}
}

func ExampleOpen() {
	ctx := context.Background()
	// The same through the registry: locker.Open(ctx, "redis://...") with
	// this package imported. The Locker owns the client and closes it.
	l, err := redis.Open(ctx, "redis://app:secret@127.0.0.1:6379/0?prefix=billing:&ttl=15s")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()

	// One cron run among many instances: whoever gets the lock runs it,
	// the others skip.
	h, err := l.TryAcquire(ctx, "cron/nightly-report")
	if errors.Is(err, locker.ErrNotAcquired) {
		fmt.Println("another instance is running the report")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer h.Release(ctx)
	fmt.Println("running the report")
}

func ExampleLocker_TryAcquire() {
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	l := redis.New(client)
	defer l.Close()

	// One payment per order: a second request for the same order gets 409.
	ctx := context.Background()
	h, err := l.TryAcquire(ctx, "payment/order-5432", locker.WithTTL(30*time.Second))
	switch {
	case errors.Is(err, locker.ErrNotAcquired):
		fmt.Println("409 Conflict: payment in progress")
		return
	case err != nil:
		log.Fatal(err)
	}
	defer h.Release(ctx)
	fmt.Println("charging the card")
}

func ExampleNew_cluster() {
	client := goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs:                 []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"},
		ContextTimeoutEnabled: true,
	})
	defer client.Close()
	l := redis.New(client) // sharded Pub/Sub and hash-tagged keys: nothing else to set
	defer l.Close()

	err := locker.Do(context.Background(), l, "leader/scheduler", func(ctx context.Context, _ locker.Handle) error {
		// ctx ends if the lock is lost.
		<-ctx.Done()
		return nil
	})
	if err != nil {
		log.Print(err)
	}
}

// A render farm limited to 3 renders at once, across every machine that
// shares the Redis server: each render takes one of the 3 permits of
// "render-farm", waiting its turn (first come, first served) while all 3 are
// held.
func ExampleLocker_AcquireSemaphore() {
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	l := redis.New(client)
	defer l.Close()

	ctx := context.Background()
	farm := locker.Semaphore(l, 3) // a Locker: Do, TryDo and AcquireAll work on it
	err := locker.Do(ctx, farm, "render-farm", func(ctx context.Context, h locker.Handle) error {
		// ctx ends if the permit is lost; the token fences the output.
		fmt.Println("rendering scene 7 with permit token", h.Token())
		return nil
	})
	if errors.Is(err, locker.ErrLimitMismatch) {
		log.Fatal("another deployment uses render-farm with another limit: ", err)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// A config read by many and written by one: readers share the read lock;
// the writer waits for the readers before it and holds back the readers
// that come after it, so a stream of readers never starves it. Its token
// is above every reader's before it, so a store that has seen a reader's
// token refuses a stale writer.
func ExampleLocker_AcquireRead() {
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	l := redis.New(client)
	defer l.Close()
	ctx := context.Background()

	r, err := l.AcquireRead(ctx, "config/app")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("reading the config under token", r.Token())
	if err := r.Release(ctx); err != nil {
		log.Print(err)
	}

	w, err := l.AcquireWrite(ctx, "config/app", locker.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer w.Release(ctx)
	// UPDATE config SET body = $1, fence = $2 WHERE fence <= $2
	fmt.Println("writing the config under token", w.Token())
}
