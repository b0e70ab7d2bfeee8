package memlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/memlock"
)

func ExampleNew() {
	ctx := context.Background()
	l := memlock.New()
	defer l.Close()

	h, err := l.Acquire(ctx, "example/new/report")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("holding", h.Key())
	if err := h.Release(ctx); err != nil {
		fmt.Println(err)
	}
	fmt.Println("after release:", h.Err())
	// Output:
	// holding example/new/report
	// after release: locker: lock released
}

// Two Lockers on one Store behave like two processes sharing a lock server.
func ExampleStore_NewLocker() {
	ctx := context.Background()
	store := memlock.NewStore()
	a, b := store.NewLocker(), store.NewLocker()
	defer a.Close()
	defer b.Close()

	h, _ := a.Acquire(ctx, "invoice/42")
	_, err := b.TryAcquire(ctx, "invoice/42")
	fmt.Println(errors.Is(err, locker.ErrNotAcquired), err)

	// b waits; a's release hands the key over at once, with a higher token.
	got := make(chan locker.Handle)
	go func() {
		hb, _ := b.Acquire(ctx, "invoice/42")
		got <- hb
	}()
	_ = h.Release(ctx)
	hb := <-got
	fmt.Println("tokens:", h.Token(), "then", hb.Token())
	_ = hb.Release(ctx)
	// Output:
	// true try-acquire "invoice/42": locker: not acquired
	// tokens: 1 then 2
}

// Close releases what the Locker holds. Its handles report the end: Done is
// closed and Err wraps both ErrReleased and ErrClosed, so work still relying
// on the lock knows to stop.
func ExampleLocker_Close() {
	ctx := context.Background()
	store := memlock.NewStore()
	l := store.NewLocker(memlock.WithDefaultTTL(5 * time.Second))

	h, _ := l.Acquire(ctx, "job")
	_ = l.Close()

	<-h.Done() // closed: work protected by the lock must stop
	fmt.Println(errors.Is(h.Err(), locker.ErrReleased), errors.Is(h.Err(), locker.ErrClosed))
	_, err := l.Acquire(ctx, "job")
	fmt.Println(err)
	// Output:
	// true true
	// acquire "job": locker: closed
}

func Example_url() {
	ctx := context.Background()
	// mem://NAME is a process-wide store: every Open of the same name shares it.
	a, err := locker.Open(ctx, "mem://example-url?ttl=10s")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()
	b, _ := locker.Open(ctx, "mem://example-url")
	defer b.Close()

	h, _ := a.TryAcquire(ctx, "cron/nightly")
	_, err = b.TryAcquire(ctx, "cron/nightly")
	fmt.Println(err)
	_ = h.Release(ctx)

	_, err = locker.Open(ctx, "mem://example-url?tll=10s")
	fmt.Println(errors.Is(err, locker.ErrInvalidURL))
	// Output:
	// try-acquire "cron/nightly": locker: not acquired
	// true
}

// A deployment moving from a backend whose highest token was 41000 sets
// the token base there, on every Locker: tokens go on above it, and Inspect
// agrees with the holder.
func ExampleWithTokenBase() {
	ctx := context.Background()
	// By URL: locker.Open(ctx, "mem://jobs?token_base=41000").
	l := memlock.NewStore().NewLocker(memlock.WithTokenBase(41000))
	defer l.Close()
	for range 2 {
		h, err := l.Acquire(ctx, "orders/42")
		if err != nil {
			fmt.Println(err)
			return
		}
		info, _ := l.Inspect(ctx, "orders/42")
		fmt.Println("token", h.Token(), "inspect", info.Token)
		_ = h.Release(ctx)
	}
	// Output:
	// token 41001 inspect 41001
	// token 41002 inspect 41002
}
