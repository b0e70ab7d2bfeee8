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
		if err := l.Err(); !errors.Is(err, locker.ErrInvalidOption) {
			t.Errorf("WithSequence(%q): Err() = %v, want ErrInvalidOption at once", bad, err)
		}
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
	if err := New(pool).Err(); err != nil {
		t.Errorf("Err() of a well-built Locker = %v", err)
	}
	l := New(nil)
	if err := l.Err(); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("New(nil).Err() = %v, want ErrInvalidOption", err)
	}
	if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("New(nil): %v, want ErrInvalidOption", err)
	}
	l.Close()
}

// Open parses its parameters strictly, before anything else, and never
// shows the password: ours (lock_*) must be known and well formed, and the
// others must be ones pgx reads, since pgx sends any other to the server as
// a run-time parameter, where a misspelt option would fail every
// connection.
func TestOpenURLInvalid(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct{ query, want string }{
		{"lock_namspace=x", "lock_namspace"},
		{"lock_health_interval=soon", "lock_health_interval"},
		{"lock_health_interval=-1s", "lock_health_interval"},
		{"ddl=maybe", "ddl"},
		{"lock_sequence=a.b.c", "sequence"},
		{"prefix=a&prefix=b", "prefix"},
		{"pool_max_con=5", "pool_max_con"},
		{"sslmode=disable&statement_timeout=5s", "statement_timeout"},
		{"SSLMODE=require", "SSLMODE"},
		{"keepalives_idle=10", "keepalives_idle"}, // libpq's, which pgx does not read
		{"ssl=1", `"ssl"`},
		{"application_name=x&conformance_unknown_option=s3cr3t-pw", "conformance_unknown_option"},
	} {
		u := "postgres://alice:s3cr3t-pw@127.0.0.1:1/db?" + c.query
		l, err := locker.Open(ctx, u)
		if err == nil {
			l.Close()
		}
		if !errors.Is(err, locker.ErrInvalidURL) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open(?%s): %v, want ErrInvalidURL naming %s", c.query, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cr3t-pw") {
			t.Errorf("Open(?%s): error shows the password: %v", c.query, err)
		}
	}
}

// Open does not contact the server (as database/sql.Open, and the redis
// backend): a Locker opened on an unreachable server fails its first call,
// with an error that does not show the password. What pgx reads is
// accepted, and passed on unchanged: pgx decodes the query as libpq does
// ("+" is a plus sign, not a space).
func TestOpenURLDoesNotConnect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u := "postgres://alice:s3cr3t-pw@127.0.0.1:1/db?connect_timeout=2&sslmode=disable&ssl=true&pool_max_conns=3" +
		"&pool_max_conn_idle_time=1m&default_query_exec_mode=exec&application_name=a+b%20c" +
		"&options=-c%20statement_timeout%3D5s&search_path=app&timezone=UTC&target_session_attrs=any" +
		"&prefix=ns&lock_health_interval=1s&ddl=false"
	opened, err := locker.Open(ctx, u)
	if err != nil {
		t.Fatalf("Open of an unreachable server: %v, want a Locker (Open does not connect)", err)
	}
	defer opened.Close()
	l := opened.(*Locker)
	cfg := l.pool.Config()
	if cfg.MaxConns != 3 || cfg.MaxConnIdleTime != time.Minute {
		t.Errorf("pool settings: MaxConns %d, MaxConnIdleTime %v; want 3, 1m", cfg.MaxConns, cfg.MaxConnIdleTime)
	}
	want := map[string]string{
		"application_name": "a+b c",
		"options":          "-c statement_timeout=5s",
		"search_path":      "app",
		"timezone":         "UTC",
	}
	got := cfg.ConnConfig.RuntimeParams
	for k, v := range want {
		if got[k] != v {
			t.Errorf("run-time parameter %s = %q, want %q", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("run-time parameter %s = %q sent to the server; only the ones asked for should be", k, got[k])
		}
	}
	if l.cfg.Prefix != "ns" || l.cfg.interval != time.Second || !l.cfg.NoDDL {
		t.Errorf("our options: namespace %q, interval %v, noDDL %v", l.cfg.Prefix, l.cfg.interval, l.cfg.NoDDL)
	}
	_, err = l.TryAcquire(ctx, "k")
	if err == nil || errors.Is(err, locker.ErrNotAcquired) || strings.Contains(err.Error(), "s3cr3t-pw") {
		t.Errorf("TryAcquire on an unreachable server: %v, want a connection error without the password", err)
	}
}

// The token sequence must hand out positive, increasing values: a cache
// (each session has its own block), a cycle, a negative increment or a
// minimum below 1 is refused, naming what to change.
func TestSequenceCheck(t *testing.T) {
	good := seqParams{cache: 1, increment: 1, min: 1}
	if err := good.check("s"); err != nil {
		t.Errorf("CACHE 1 INCREMENT 1 MINVALUE 1 NO CYCLE: %v", err)
	}
	if err := (seqParams{cache: 1, increment: 7, min: 100}).check("s"); err != nil {
		t.Errorf("INCREMENT 7 MINVALUE 100: %v", err)
	}
	for _, c := range []struct {
		sp   seqParams
		want string
	}{
		{seqParams{cache: 1, increment: -1, min: 1}, "INCREMENT BY 1"},
		{seqParams{cache: 1, increment: 0, min: 1}, "INCREMENT BY 1"},
		{seqParams{cache: 1, increment: 1, min: 0}, "MINVALUE 1"},
		{seqParams{cache: 1, increment: 1, min: -9}, "MINVALUE 1"},
		{seqParams{cache: 20, increment: 1, min: 1}, "CACHE 1"},
		{seqParams{cache: 1, increment: 1, min: 1, cycle: true}, "NO CYCLE"},
		{seqParams{cache: 5, increment: -2, min: -10, cycle: true}, "ALTER SEQUENCE s INCREMENT BY 1 MINVALUE 1 CACHE 1 NO CYCLE"},
	} {
		err := c.sp.check("s")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want a refusal saying %q", c.sp, err, c.want)
		}
	}
}

// A call whose context was cancelled with a cause, or that comes after
// Close, is refused before anything reaches the server; the first error
// wraps both context.Canceled and the cause (86a479e reported only
// context.Canceled), the second ErrClosed.
func TestRefusedCalls(t *testing.T) {
	l := New(unreachablePool(t))
	cause := errors.New("the caller gave up")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
		t.Errorf("TryAcquire with a context cancelled with a cause: %v, want context.Canceled and the cause", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(context.Background(), "k"); !errors.Is(err, locker.ErrClosed) {
		t.Errorf("Acquire after Close: %v, want ErrClosed", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestQualified(t *testing.T) {
	for name, want := range map[string]bool{
		"locker_fence": false, `"a.b"`: false, "s.seq": true, `"my.schema".seq`: true, `s."a.b"`: true, `"x""."`: false,
	} {
		if !sequenceName.MatchString(name) {
			t.Fatalf("%q is not a sequence name", name)
		}
		if got := qualified(name); got != want {
			t.Errorf("qualified(%q) = %v, want %v", name, got, want)
		}
	}
}
