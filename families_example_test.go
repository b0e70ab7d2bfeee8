package locker_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/memlock"
)

// A render farm limited to 3 jobs at once: each worker takes one of the 3
// permits of the semaphore "render"; the fourth is told the farm is full.
func ExampleSemaphore() {
	ctx := context.Background()
	store := memlock.NewStore()
	l := store.NewLocker()
	defer l.Close()

	farm := locker.Semaphore(l, 3)
	var permits []locker.Handle
	for job := 1; job <= 4; job++ {
		h, err := farm.TryAcquire(ctx, "render")
		if errors.Is(err, locker.ErrNotAcquired) {
			fmt.Printf("job %d: the farm is full\n", job)
			continue
		}
		fmt.Printf("job %d: rendering (token %d)\n", job, h.Token())
		permits = append(permits, h)
	}
	for _, h := range permits {
		_ = h.Release(ctx)
	}
	// Output:
	// job 1: rendering (token 1)
	// job 2: rendering (token 2)
	// job 3: rendering (token 3)
	// job 4: the farm is full
}

// A config read by many and written by one: readers share the read lock; a
// writer waits for them, and readers that come after a waiting writer wait
// behind it. The writer's token is above every reader's, so a store that has
// seen a reader's token can refuse a stale writer.
func ExampleReadLock() {
	ctx := context.Background()
	store := memlock.NewStore()
	a, b := store.NewLocker(), store.NewLocker()
	defer a.Close()
	defer b.Close()

	r1, _ := locker.ReadLock(a).Acquire(ctx, "config")
	r2, _ := locker.ReadLock(b).Acquire(ctx, "config")
	fmt.Println("two readers:", r1.Token(), r2.Token())

	written := make(chan locker.Handle)
	go func() {
		w, _ := locker.WriteLock(b).Acquire(ctx, "config") // waits for both readers
		written <- w
	}()
	_ = r1.Release(ctx)
	_ = r2.Release(ctx)
	w := <-written
	fmt.Println("the writer:", w.Token())
	_ = w.Release(ctx)
	// Output:
	// two readers: 1 2
	// the writer: 3
}

// A transfer between two accounts takes both locks, all or nothing, in one
// order whatever order the caller names them: two transfers in opposite
// directions never deadlock.
func ExampleDoAll() {
	ctx := context.Background()
	l := memlock.New()
	defer l.Close()

	err := locker.DoAll(ctx, l, []string{"account/B", "account/A"}, func(ctx context.Context, m *locker.Multi) error {
		fmt.Println("holding", m.Keys())
		// Fence each account's write with its own lock's token:
		// m.Token("account/A"), m.Token("account/B").
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// holding [account/A account/B]
	// err: <nil>
}
