package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/postgres"
)

// The sequence is checked before any lock is taken: WithoutDDL shows the SQL
// to run; a cached sequence (tokens out of order between sessions), a
// descending one and one that may hand out values below 1 are refused; a
// custom, schema-qualified, quoted name works. (Names that are
// not SQL identifiers never reach the server: TestInvalidOptions in the
// postgres package.)
func TestSequence(t *testing.T) {
	ctx := testCtx(t)
	pool := sharedPool(t, 4)
	suffix := fmt.Sprintf("%d", time.Now().UnixNano())

	missing := "locker_test_missing_" + suffix
	l := newLocker(t, pool, postgres.WithSequence(missing), postgres.WithoutDDL())
	_, err := l.TryAcquire(ctx, testKey(t, ""))
	if err == nil || !strings.Contains(err.Error(), "CREATE SEQUENCE IF NOT EXISTS "+missing) {
		t.Fatalf("TryAcquire with a missing sequence and WithoutDDL: %v, want the CREATE SEQUENCE to run", err)
	}

	cached := "locker_test_cached_" + suffix
	if _, err := pool.Exec(ctx, "CREATE SEQUENCE "+cached+" CACHE 20"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP SEQUENCE IF EXISTS "+cached) })
	l = newLocker(t, pool, postgres.WithSequence(cached))
	if _, err := l.TryAcquire(ctx, testKey(t, "")); err == nil || !strings.Contains(err.Error(), "CACHE 1") {
		t.Fatalf("TryAcquire with a CACHE 20 sequence: %v, want a refusal naming CACHE 1", err)
	}

	// Tokens must go up and be positive: a negative increment, or values
	// that may be below 1, are refused too.
	for _, c := range []struct{ opts, want string }{
		{"INCREMENT BY -1 MINVALUE 1 MAXVALUE 1000000 START 1000000", "INCREMENT BY 1"},
		{"MINVALUE 0 START 0", "MINVALUE 1"},
	} {
		bad := fmt.Sprintf("locker_test_bad_%d_%s", len(c.want), suffix)
		if _, err := pool.Exec(ctx, "CREATE SEQUENCE "+bad+" "+c.opts+" NO CYCLE CACHE 1"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pool.Exec(context.Background(), "DROP SEQUENCE IF EXISTS "+bad) })
		l = newLocker(t, pool, postgres.WithSequence(bad))
		if _, err := l.TryAcquire(ctx, testKey(t, "")); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("TryAcquire with a sequence made %s: %v, want a refusal naming %s", c.opts, err, c.want)
		}
	}

	schema := "locker_test_" + suffix
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	name := schema + `."Fence ""seq"""`
	l = newLocker(t, pool, postgres.WithSequence(name))
	h, err := l.TryAcquire(ctx, testKey(t, ""))
	if err != nil {
		t.Fatalf("TryAcquire with sequence %s: %v", name, err)
	}
	if h.Token() != 1 {
		t.Errorf("first token of a new sequence = %d, want 1", h.Token())
	}
	mustRelease(t, ctx, h)
}

// Open parses our parameters, passes the rest to pgx, and owns (closes) its
// pool; server settings given in options reach the server; a server that
// refuses the password fails the first call, with an error without it. (The
// strict parsing that rejects a URL: TestOpenURLInvalid in the postgres
// package.)
func TestOpenURL(t *testing.T) {
	ctx := testCtx(t)
	dsn := testserver.Postgres(t).DSN()
	direct := sharedPool(t, 4)
	for _, scheme := range []string{"postgres", "postgresql"} {
		app := fmt.Sprintf("locker-url-test-%d", time.Now().UnixNano())
		u := withHost(t, dsn, "", url.Values{"prefix": {"url-test"}, "lock_health_interval": {"1s"}, "pool_max_conns": {"3"}, "application_name": {app}})
		u = scheme + u[strings.Index(u, "://"):]
		l, err := locker.Open(ctx, u)
		if err != nil {
			t.Fatalf("Open(%s): %v", scheme, err)
		}
		k := testKey(t, "")
		h, err := l.TryAcquire(ctx, k)
		if err != nil {
			t.Fatalf("TryAcquire on an opened Locker: %v", err)
		}
		// prefix reached the Locker: it locked k in namespace url-test.
		if _, err := newLocker(t, direct, postgres.WithPrefix("url-test")).TryAcquire(ctx, k); !errors.Is(err, locker.ErrNotAcquired) {
			t.Errorf("Open(%s): TryAcquire of the opened Locker's key in namespace url-test: %v, want ErrNotAcquired (prefix ignored?)", scheme, err)
		}
		// pool_max_conns reached pgx: three held locks exhaust the pool.
		var more []locker.Handle
		for i := range 2 {
			more = append(more, mustAcquire(t, ctx, l, testKey(t, fmt.Sprintf("/%d", i))))
		}
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err = l.TryAcquire(wctx, testKey(t, "/3"))
		cancel()
		if !errors.Is(err, postgres.ErrPoolExhausted) || !strings.Contains(err.Error(), "all 3 connections") {
			t.Errorf("Open(%s): a fourth lock with three held: %v, want ErrPoolExhausted naming all 3 connections (pool_max_conns ignored?)", scheme, err)
		}
		for _, h := range more {
			mustRelease(t, ctx, h)
		}
		if n := sessions(t, ctx, direct, app); n == 0 {
			t.Fatalf("Open(%s): no session with application_name %s on the server; cannot check that Close closes the pool", scheme, app)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(h.Err(), locker.ErrReleased) {
			t.Errorf("handle after Close: Err() = %v, want ErrReleased", h.Err())
		}
		// The Locker owned its pool and closed it: the pool's sessions end
		// (an open pool would keep its idle connections).
		deadline := time.Now().Add(10 * time.Second)
		for sessions(t, ctx, direct, app) != 0 {
			if time.Now().After(deadline) {
				t.Errorf("the pool of an opened Locker is still open after Close: %d sessions on the server", sessions(t, ctx, direct, app))
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// lock_health_interval reached the Locker: a holder cut off from the
	// server hears of it within about two intervals of 250ms, where the
	// default interval (5s) would take at least 5s.
	px := testserver.NewProxy(t, testserver.Postgres(t).Addr())
	l, err := locker.Open(ctx, withHost(t, dsn, px.Addr(), url.Values{"lock_health_interval": {"250ms"}}))
	if err != nil {
		t.Fatalf("Open through a proxy: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	h := mustAcquire(t, ctx, l, testKey(t, "/interval"))
	px.Blackhole(t)
	took := waitDone(t, h, 4*time.Second, "holder of a Locker opened with lock_health_interval=250ms, cut off")
	px.Heal(t)
	t.Logf("Done() closed %v after the cut", took)
	if !errors.Is(h.Err(), locker.ErrLost) {
		t.Errorf("Err() = %v, want ErrLost", h.Err())
	}

	// Server settings go in options, as with libpq, and reach the server
	// unchanged (spaces written %20).
	app := fmt.Sprintf("locker-options-test-%d", time.Now().UnixNano())
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	lo, err := locker.Open(ctx, dsn+sep+"options=-c%20application_name%3D"+app)
	if err != nil {
		t.Fatalf("Open with options: %v", err)
	}
	t.Cleanup(func() { lo.Close() })
	// Checked after the release: while a session holds a lock, its
	// application_name names the holder (see Inspect), and the release
	// sets it back.
	ho := mustAcquire(t, ctx, lo, testKey(t, "/options"))
	mustRelease(t, ctx, ho)
	if n := sessions(t, ctx, direct, app); n == 0 {
		t.Errorf("Open with options=-c application_name=%s: no such session on the server", app)
	}

	// Open does not contact the server: a server that refuses the password
	// fails the first call, and the error does not show the password.
	bad := withHost(t, dsn, "", nil)
	bu, _ := url.Parse(bad)
	bu.User = url.UserPassword(bu.User.Username(), "wr0ng-pw-xyz")
	lb, err := locker.Open(ctx, bu.String())
	if err != nil {
		t.Fatalf("Open with a wrong password: %v; Open does not contact the server, the first call fails", err)
	}
	t.Cleanup(func() { lb.Close() })
	hb, err := lb.TryAcquire(ctx, testKey(t, "/bad-password"))
	switch {
	case err == nil:
		t.Log("server accepted a wrong password (trust authentication?); skipping the refusal check")
		mustRelease(t, ctx, hb)
	case errors.Is(err, locker.ErrNotAcquired):
		t.Errorf("TryAcquire with a wrong password: %v; a refused connection is not ErrNotAcquired", err)
	case strings.Contains(err.Error(), "wr0ng-pw-xyz"):
		t.Errorf("TryAcquire with a wrong password: error shows it: %v", err)
	default:
		t.Logf("TryAcquire with a wrong password: %v", err)
	}
}

// sessions counts the server sessions with application_name app.
func sessions(t *testing.T, ctx context.Context, pool *pgxpool.Pool, app string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil {
		t.Fatalf("pg_stat_activity: %v", err)
	}
	return n
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
		// The statement the package documentation gives for WithoutDDL.
		"CREATE SEQUENCE IF NOT EXISTS " + seq + " AS bigint MINVALUE 1 NO CYCLE CACHE 1",
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
		l := newLocker(t, app, postgres.WithSequence("locker_fence_"+suffix))
		_, err := l.TryAcquire(ctx, testKey(t, ""))
		if err == nil || !strings.Contains(err.Error(), "WithoutDDL") || !strings.Contains(err.Error(), "CREATE SEQUENCE") {
			t.Errorf("TryAcquire by a role that may not create the sequence: %v, want an error showing the SQL", err)
		}
	} else {
		t.Log("this server lets every role create in public; skipping the refusal check")
	}
	l := newLocker(t, app, postgres.WithSequence(seq), postgres.WithoutDDL())
	h, err := l.TryAcquire(ctx, testKey(t, ""))
	if err != nil {
		t.Fatalf("TryAcquire with an administrator-made sequence: %v", err)
	}
	if h.Token() != 1 {
		t.Errorf("first token = %d, want 1", h.Token())
	}
	mustRelease(t, ctx, h)
}

// TestSequenceCreatedByManyAtOnce: Lockers of several processes that start
// together on a database without the sequence each create it, all at once,
// and every first Acquire succeeds (CREATE SEQUENCE IF NOT EXISTS is not
// atomic: the losers of the race get a unique violation on the catalog).
// Each round uses a sequence of its own, so each is a race on a fresh one.
func TestSequenceCreatedByManyAtOnce(t *testing.T) {
	ctx := testCtx(t)
	const lockers, rounds = 8, 6
	pool := sharedPool(t, 4)
	for round := range rounds {
		seq := fmt.Sprintf("locker_test_race_%d_%d", time.Now().UnixNano(), round)
		t.Cleanup(func() { pool.Exec(context.Background(), "DROP SEQUENCE IF EXISTS "+seq) })
		ls := make([]*postgres.Locker, lockers)
		for i := range ls {
			ls[i] = newLocker(t, sharedPool(t, 2), postgres.WithSequence(seq))
		}
		start := make(chan struct{})
		errs := make(chan error, lockers)
		for i, l := range ls {
			go func() {
				<-start
				h, err := l.Acquire(ctx, fmt.Sprintf("%s/%d", testKey(t, ""), i))
				if err == nil {
					err = h.Release(ctx)
				}
				errs <- err
			}()
		}
		close(start)
		for range ls {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: a first Acquire while others create the sequence: %v", round, err)
			}
		}
	}
}

// A WithSequence name taken by a table: the first Acquire says so, and
// names the relation's kind, rather than create nothing or lock without
// tokens.
func TestSequenceNameTakenByTable(t *testing.T) {
	ctx := testCtx(t)
	pool := sharedPool(t, 2)
	name := fmt.Sprintf("locker_test_not_seq_%d", time.Now().UnixNano())
	if _, err := pool.Exec(ctx, "CREATE TABLE "+name+" (id int)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+name) })
	l := newLocker(t, pool, postgres.WithSequence(name))
	h, err := l.TryAcquire(ctx, testKey(t, ""))
	if err == nil {
		_ = h.Release(ctx)
		t.Fatalf("TryAcquire with a table named as the token sequence succeeded (token %d)", h.Token())
	}
	if !strings.Contains(err.Error(), name+" exists but is not a sequence") || !strings.Contains(err.Error(), `relkind "r"`) {
		t.Fatalf("TryAcquire with a table named as the token sequence: %v, want it to say the name is a table's", err)
	}
}
