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
