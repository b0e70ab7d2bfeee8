package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/etcd"
)

// A job that must run on one instance at a time, on the caller's own
// etcd client.
func ExampleNew() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	l := etcd.New(cli, etcd.WithPrefix("/myapp/locks"))
	defer l.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := l.Acquire(ctx, "nightly-report", locker.WithTTL(15*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer h.Release(context.Background())
	// Pass h.Token() to the storage you write to, and let it refuse
	// writes with a lower token than one it has seen.
	fmt.Println("running with fencing token", h.Token())
	select {
	case <-h.Done(): // the lock was lost: stop writing
		log.Print(h.Err())
	default:
	}
}

// One payment per order: a second request gets "already in progress".
func ExampleLocker_TryAcquire() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	l := etcd.New(cli)
	defer l.Close()

	// The etcd client waits for a connection as long as the context
	// allows: bound it, so that an unreachable cluster is an error.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h, err := l.TryAcquire(ctx, "order/42")
	switch {
	case errors.Is(err, locker.ErrNotAcquired):
		fmt.Println("409: payment already in progress")
		return
	case err != nil:
		log.Fatal(err) // etcd unreachable: not the same as "taken"
	}
	defer h.Release(ctx)
	fmt.Println("charging order 42")
}

// Opening by URL: the Locker owns its client.
func ExampleOpen() {
	l, err := locker.Open(context.Background(), "etcd://127.0.0.1:2379/myapp/locks?ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
}

// A render farm: at most 3 renders at once across every machine. Each
// render holds one of the 3 permits of "render-farm"; the others wait in
// line, first come first served, each woken when a permit is its turn.
func ExampleLocker_AcquireSemaphore() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	l := etcd.New(cli, etcd.WithPrefix("/farm/locks"))
	defer l.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	// Every machine must ask for the same limit: another n on a key
	// that is held fails with locker.ErrLimitMismatch.
	permit, err := l.AcquireSemaphore(ctx, "render-farm", 3, locker.WithTTL(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	defer permit.Release(context.Background())
	fmt.Println("rendering, permit token", permit.Token())
	// locker.Semaphore(l, 3) is the same semaphore as a locker.Locker:
	// locker.Do(ctx, locker.Semaphore(l, 3), "render-farm", render).
}

// A configuration read by many and written by one: readers share the
// key; a writer waits for the readers before it and excludes everyone;
// readers that come after a waiting writer wait behind it, so a stream of
// readers never starves the writer.
func ExampleLocker_AcquireWrite() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	l := etcd.New(cli)
	defer l.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Many services read the configuration at once.
	r, err := l.AcquireRead(ctx, "config/payments")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("reading the configuration")
	_ = r.Release(ctx)

	// One deploy rewrites it. The write's token is above every token of
	// the readers and writers before it: a store that remembers the
	// highest token it has seen refuses a stale writer's write.
	w, err := l.AcquireWrite(ctx, "config/payments")
	if err != nil {
		log.Fatal(err)
	}
	defer w.Release(context.Background())
	fmt.Println("writing the configuration, token", w.Token())
}
