package postgres

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/testserver"
)

// The sequence is checked before any lock is taken: WithoutDDL shows the SQL
// to run; a cached sequence (tokens out of order between sessions) is
// refused; a custom, schema-qualified, quoted name works.
func TestSequence(t *testing.T) {
	ctx := testCtx(t)
	pool := sharedPool(t, 4)
	suffix := fmt.Sprintf("%d", time.Now().UnixNano())

	missing := "locker_test_missing_" + suffix
	l := newLocker(t, pool, WithSequence(missing), WithoutDDL())
	_, err := l.TryAcquire(ctx, testKey(t, ""))
	if err == nil || !strings.Contains(err.Error(), "CREATE SEQUENCE IF NOT EXISTS "+missing) {
		t.Fatalf("TryAcquire with a missing sequence and WithoutDDL: %v, want the CREATE SEQUENCE to run", err)
	}

	cached := "locker_test_cached_" + suffix
	if _, err := pool.Exec(ctx, "CREATE SEQUENCE "+cached+" CACHE 20"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP SEQUENCE IF EXISTS "+cached) })
	l = newLocker(t, pool, WithSequence(cached))
	if _, err := l.TryAcquire(ctx, testKey(t, "")); err == nil || !strings.Contains(err.Error(), "CACHE 1") {
		t.Fatalf("TryAcquire with a CACHE 20 sequence: %v, want a refusal naming CACHE 1", err)
	}

	schema := "locker_test_" + suffix
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	name := schema + `."Fence ""seq"""`
	l = newLocker(t, pool, WithSequence(name))
	h, err := l.TryAcquire(ctx, testKey(t, ""))
	if err != nil {
		t.Fatalf("TryAcquire with sequence %s: %v", name, err)
	}
	if h.Token() != 1 {
		t.Errorf("first token of a new sequence = %d, want 1", h.Token())
	}
	mustRelease(t, ctx, h)

	for _, bad := range []string{"", "a;DROP TABLE x", "a.b.c", `"unterminated`, "1abc"} {
		l := New(pool, WithSequence(bad))
		if _, err := l.TryAcquire(ctx, testKey(t, "")); !errors.Is(err, locker.ErrInvalidOption) {
			t.Errorf("WithSequence(%q): %v, want ErrInvalidOption", bad, err)
		}
		l.Close()
	}
	l = New(pool, WithHealthCheckInterval(0))
	if _, err := l.Acquire(ctx, testKey(t, "")); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("WithHealthCheckInterval(0): %v, want ErrInvalidOption", err)
	}
	l.Close()
}

// Open parses our parameters strictly, passes the rest to pgx, never shows
// the password, and owns (closes) its pool.
func TestOpenURL(t *testing.T) {
	ctx := testCtx(t)
	dsn := testserver.Postgres(t).DSN()
	for _, scheme := range []string{"postgres", "postgresql"} {
		u := withHost(t, dsn, "", url.Values{"lock_namespace": {"url-test"}, "lock_health_interval": {"1s"}, "pool_max_conns": {"3"}})
		u = scheme + u[strings.Index(u, "://"):]
		l, err := locker.Open(ctx, u)
		if err != nil {
			t.Fatalf("Open(%s): %v", scheme, err)
		}
		pl := l.(*Locker)
		if pl.cfg.namespace != "url-test" || pl.cfg.interval != time.Second || pl.pool.Config().MaxConns != 3 {
			t.Errorf("Open(%s): namespace %q, interval %v, max conns %d", scheme, pl.cfg.namespace, pl.cfg.interval, pl.pool.Config().MaxConns)
		}
		h, err := l.TryAcquire(ctx, testKey(t, ""))
		if err != nil {
			t.Fatalf("TryAcquire on an opened Locker: %v", err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(h.Err(), locker.ErrReleased) {
			t.Errorf("handle after Close: Err() = %v, want ErrReleased", h.Err())
		}
		if _, err := pl.pool.Acquire(ctx); err == nil {
			t.Errorf("the pool of an opened Locker is still open after Close")
		}
	}

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
	// A server that refuses the password: the error says so without it.
	bad := withHost(t, dsn, "", nil)
	bu, _ := url.Parse(bad)
	bu.User = url.UserPassword(bu.User.Username(), "wr0ng-pw-xyz")
	_, err := locker.Open(ctx, bu.String())
	if err == nil {
		t.Log("server accepted a wrong password (trust authentication?); skipping the refusal check")
	} else if strings.Contains(err.Error(), "wr0ng-pw-xyz") {
		t.Errorf("Open with a wrong password: error shows it: %v", err)
	}
	// An unreachable server fails Open, password unseen.
	_, err = locker.Open(ctx, "postgres://alice:s3cr3t-pw@127.0.0.1:1/db?connect_timeout=2")
	if err == nil || strings.Contains(err.Error(), "s3cr3t-pw") {
		t.Errorf("Open of an unreachable server: %v", err)
	}
}

// A role that may not run DDL (the default since PostgreSQL 15, which no
// longer lets every role create in public): creating the sequence fails with
// an error that shows the SQL to run; with the sequence created by an
// administrator and WithoutDDL, locks work.
func TestRoleWithoutDDL(t *testing.T) {
	ctx := testCtx(t)
	dsn := testserver.Postgres(t).DSN()
	admin := newPool(t, dsn, 2)
	suffix := fmt.Sprintf("%d", time.Now().UnixNano())
	role, schema := "locker_app_"+suffix, "locker_s_"+suffix
	if _, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN PASSWORD 'app-pw'"); err != nil {
		t.Skipf("cannot create a role on this server: %v", err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		admin.Exec(ctx, "DROP OWNED BY "+role)
		admin.Exec(ctx, "DROP ROLE IF EXISTS "+role)
	})
	var canCreate bool
	if err := admin.QueryRow(ctx, "SELECT has_schema_privilege($1, 'public', 'CREATE')", role).Scan(&canCreate); err != nil {
		t.Fatal(err)
	}
	seq := schema + ".fence"
	for _, stmt := range []string{
		"CREATE SCHEMA " + schema,
		createSequenceSQL(seq),
		"GRANT USAGE ON SCHEMA " + schema + " TO " + role,
		"GRANT USAGE ON SEQUENCE " + seq + " TO " + role,
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	u, _ := url.Parse(dsn)
	u.User = url.UserPassword(role, "app-pw")
	app := newPool(t, u.String(), 2)

	if !canCreate {
		l := newLocker(t, app, WithSequence("locker_fence_"+suffix))
		_, err := l.TryAcquire(ctx, testKey(t, ""))
		if err == nil || !strings.Contains(err.Error(), "WithoutDDL") || !strings.Contains(err.Error(), "CREATE SEQUENCE") {
			t.Errorf("TryAcquire by a role that may not create the sequence: %v, want an error showing the SQL", err)
		}
	} else {
		t.Log("this server lets every role create in public; skipping the refusal check")
	}
	l := newLocker(t, app, WithSequence(seq), WithoutDDL())
	h, err := l.TryAcquire(ctx, testKey(t, ""))
	if err != nil {
		t.Fatalf("TryAcquire with an administrator-made sequence: %v", err)
	}
	if h.Token() != 1 {
		t.Errorf("first token = %d, want 1", h.Token())
	}
	mustRelease(t, ctx, h)
}
