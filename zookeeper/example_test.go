package zookeeper_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/zookeeper"
)

// Connect dials sessions of its own (one per lease in use); Close closes
// them. A lock's lease, the longest it outlives a holder gone silent, is
// its TTL: a session of that timeout owns its node.
func ExampleConnect() {
	ctx := context.Background()
	l, err := zookeeper.Connect(ctx, []string{"127.0.0.1:2181"}, zookeeper.WithDefaultTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()

	h, err := l.Acquire(ctx, "invoice/42", locker.WithTTL(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer h.Release(context.WithoutCancel(ctx))
	fmt.Println("holding with token", h.Token(), "and lease", h.TTL())
}

// New shares a connection the program made and keeps using. WithServers
// lets it dial sessions of its own for locks whose TTL is not the
// connection's session timeout.
func ExampleNew() {
	servers := []string{"127.0.0.1:2181"}
	conn, events, err := zk.Connect(servers, 10*time.Second,
		// The Locker reads the event channel; the program sees the events here.
		zk.WithEventCallback(func(ev zk.Event) {}))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	l := zookeeper.New(conn, events, zookeeper.WithSessionTimeout(10*time.Second), zookeeper.WithServers(servers...))
	defer l.Close()
	_ = l
}

func ExampleLocker_TryAcquire() {
	ctx := context.Background()
	l, err := locker.Open(ctx, "zookeeper://127.0.0.1:2181/locker?ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	h, err := l.TryAcquire(ctx, "cron/nightly-report")
	switch {
	case errors.Is(err, locker.ErrNotAcquired):
		return // another instance runs it
	case err != nil:
		log.Fatal(err) // the server failed: not the same as "taken"
	}
	defer h.Release(context.WithoutCancel(ctx))
}

// Lock directories are named after the key, escaped into one path component.
func ExampleLockDir() {
	fmt.Println(zookeeper.LockDir("", "orders/42"))
	fmt.Println(zookeeper.LockDir("/app/locks", ".."))
	// Output:
	// /locker/korders%2F42
	// /app/locks/k..
}

// A render farm limited to 3 concurrent renders: each worker takes one of
// the 3 permits of "render-farm" for the length of a job. A fourth waits,
// first come first served, until a permit is released (or its holder's
// session ends). The permit's token fences the job's writes as a mutex's
// does.
func ExampleLocker_AcquireSemaphore() {
	ctx := context.Background()
	l, err := zookeeper.Connect(ctx, []string{"127.0.0.1:2181"})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()

	permit, err := l.AcquireSemaphore(ctx, "render-farm", 3, locker.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err) // a worker asking for another limit gets locker.ErrLimitMismatch
	}
	defer permit.Release(context.WithoutCancel(ctx))
	fmt.Println("rendering with permit token", permit.Token())

	// The same through the root package's view, which Do and AcquireAll take.
	err = locker.Do(ctx, locker.Semaphore(l, 3), "render-farm", func(ctx context.Context, h locker.Handle) error {
		return nil // render
	})
	if err != nil {
		log.Fatal(err)
	}
}

// A configuration read by many and written by one: readers share the key,
// a writer has it alone, and readers that come after a waiting writer wait
// behind it, so a stream of readers never starves it. A reader's token is
// above every earlier writer's: the store can refuse a write older than a
// version someone read.
func ExampleLocker_AcquireWrite() {
	ctx := context.Background()
	l, err := zookeeper.Connect(ctx, []string{"127.0.0.1:2181"})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()

	r, err := l.AcquireRead(ctx, "config/app")
	if err != nil {
		log.Fatal(err)
	}
	// ... read the configuration ...
	_ = r.Release(ctx)

	w, err := l.AcquireWrite(ctx, "config/app")
	if err != nil {
		log.Fatal(err)
	}
	defer w.Release(context.WithoutCancel(ctx))
	fmt.Println("writing the configuration with token", w.Token())
}
