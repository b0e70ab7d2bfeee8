package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-locker/locker"
)

// These tests need no server: what they check happens before the Locker
// talks to one. The tests against a real PostgreSQL are in the integration
// module (integration/postgres).

// unreachablePool returns a pool that has never connected, and whose first
// connection attempt would fail: a call that got past option validation
// would report a connection error, not ErrInvalidOption.
func unreachablePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	if err != nil {
		t.Fatalf("pgxpool.New: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Invalid options are reported by every call, wrapping ErrInvalidOption,
// before anything reaches the server; sequence names must be SQL
// identifiers (they go into the CREATE SEQUENCE statement).
func TestInvalidOptions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := unreachablePool(t)
	for _, bad := range []string{"", "a;DROP TABLE x", "a.b.c", `"unterminated`, "1abc"} {
		l := New(pool, WithSequence(bad))
		if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, locker.ErrInvalidOption) {
			t.Errorf("WithSequence(%q): %v, want ErrInvalidOption", bad, err)
		}
		l.Close()
	}
	for _, good := range []string{"locker_fence", "Fence$2", `s."Fence ""seq"""`, `"a.b"."c"`} {
		if cfg := newConfig([]Option{WithSequence(good)}); cfg.err != nil || cfg.sequence != good {
			t.Errorf("WithSequence(%q): sequence %q, error %v", good, cfg.sequence, cfg.err)
		}
	}
	for _, d := range []time.Duration{0, -time.Second} {
		l := New(pool, WithHealthCheckInterval(d))
		if _, err := l.Acquire(ctx, "k"); !errors.Is(err, locker.ErrInvalidOption) {
			t.Errorf("WithHealthCheckInterval(%v): %v, want ErrInvalidOption", d, err)
		}
		l.Close()
	}
	l := New(nil)
	if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("New(nil): %v, want ErrInvalidOption", err)
	}
	l.Close()
}

// Open parses our parameters strictly, before it connects, and never shows
// the password; a server that cannot be reached fails Open.
func TestOpenURLInvalid(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct{ query, want string }{
		{"lock_namspace=x", "lock_namspace"},
		{"lock_health_interval=soon", "lock_health_interval"},
		{"lock_health_interval=-1s", "lock_health_interval"},
		{"lock_ddl=maybe", "lock_ddl"},
		{"lock_sequence=a.b.c", "sequence"},
		{"lock_namespace=a&lock_namespace=b", "lock_namespace"},
	} {
		u := "postgres://alice:s3cr3t-pw@127.0.0.1:1/db?" + c.query
		_, err := locker.Open(ctx, u)
		if !errors.Is(err, locker.ErrInvalidURL) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open(?%s): %v, want ErrInvalidURL naming %s", c.query, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cr3t-pw") {
			t.Errorf("Open(?%s): error shows the password: %v", c.query, err)
		}
	}
	// An unreachable server fails Open, password unseen.
	_, err := locker.Open(ctx, "postgres://alice:s3cr3t-pw@127.0.0.1:1/db?connect_timeout=2")
	if err == nil || strings.Contains(err.Error(), "s3cr3t-pw") {
		t.Errorf("Open of an unreachable server: %v", err)
	}
}
