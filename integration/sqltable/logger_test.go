package sqltable_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-locker/locker/sqltable"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
)

// TestLoggerAtRisk: a holder partitioned from its server is told its
// lock is at risk (locker.AtRisker) before it is lost, and cleared once the
// partition heals; WithLogger records both, with the key.
func TestLoggerAtRisk(t *testing.T) {
	rec := &testserver.LogRecorder{}
	srv := testserver.Postgres(t)
	px := testserver.NewProxy(t, srv.Addr())
	dsn := pgURL(t, px.Addr(), nil)
	dsn = "postgres" + dsn[len(sqltable.SchemePostgres):]
	l := sqltable.New(openDB(t, "pgx", dsn), sqltable.WithLogger(rec.Logger()))
	t.Cleanup(func() { _ = l.Close() })
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
