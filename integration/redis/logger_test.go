package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-locker/locker/redis"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
)

// TestLoggerAtRisk: a holder partitioned from its server is told its
// lock is at risk (locker.AtRisker) before it is lost, and cleared once the
// partition heals; WithLogger records both, with the key.
func TestLoggerAtRisk(t *testing.T) {
	rec := &testserver.LogRecorder{}
	px := testserver.NewProxy(t, testserver.Redis(t).Addr())
	l := newTestLocker(t, px.Addr(), redis.WithLogger(rec.Logger()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := "logger/" + t.Name()
	h, err := l.Acquire(ctx, key, locker.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	testserver.AtRiskThenCleared(t, h, 3*time.Second, px)
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rec.Want(t, "WARN", "at risk", `key="`+key)
	rec.WaitFor(t, 5*time.Second, "INFO", "no longer at risk") // logged just after AtRisk reports the change
}

// TestLoggerPubSubReplaced: the waiter's connections are reset while it
// waits; WithLogger records the Pub/Sub connection replaced, and the
// waiter still gets the lock.
func TestLoggerPubSubReplaced(t *testing.T) {
	rec := &testserver.LogRecorder{}
	srv := testserver.Redis(t)
	px := testserver.NewProxy(t, srv.Addr())
	waiter := newTestLocker(t, px.Addr(), redis.WithLogger(rec.Logger()))
	holder := newTestLocker(t, srv.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := "logger/" + t.Name()
	h, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		wh, err := waiter.Acquire(ctx, key)
		if err == nil {
			err = wh.Release(ctx)
		}
		got <- err
	}()
	// The server is the witness: the waiter is subscribed before the reset.
	_, _, wake := waiter.KeyNames(key)
	admin := testClient(t, srv.Addr(), true)
	waitSubscribed(t, ctx, admin, wake)
	px.ResetAll(t)
	rec.WaitFor(t, 10*time.Second, "WARN", "Pub/Sub connection replaced", "err=")
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
}
