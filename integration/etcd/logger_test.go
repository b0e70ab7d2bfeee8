package etcd_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-locker/locker/etcd"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
)

// TestLoggerAtRisk: a holder partitioned from its server is told its
// lock is at risk (locker.AtRisker) before it is lost, and cleared once the
// partition heals; WithLogger records both, with the key.
func TestLoggerAtRisk(t *testing.T) {
	rec := &testserver.LogRecorder{}
	c := newClient(t, testserver.Etcd(t).Addr(), etcd.WithLogger(rec.Logger()))
	l := c.l
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := "logger/" + t.Name()
	h, err := l.Acquire(ctx, key, locker.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	testserver.AtRiskThenCleared(t, h, 3*time.Second, c.px)
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rec.Want(t, "WARN", "at risk", "lease=")
	rec.WaitFor(t, 5*time.Second, "INFO", "no longer at risk") // logged just after AtRisk reports the change
}
