package portability_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"

	_ "github.com/go-locker/locker/etcd"
	_ "github.com/go-locker/locker/memlock"
	_ "github.com/go-locker/locker/postgres"
	_ "github.com/go-locker/locker/redis"
	_ "github.com/go-locker/locker/redis/redlock"
	_ "github.com/go-locker/locker/sqltable/mysql"
	_ "github.com/go-locker/locker/sqltable/pgx"
	_ "github.com/go-locker/locker/sqltable/sqlite"
	_ "github.com/go-locker/locker/zookeeper"
)

// The package's TestMain (testserver.Main, which removes the containers
// when the binary ends) is main_test.go's, which the package's other tests
// bring; without it scripts/with-servers.sh removes them.

// TestChangingBackends follows README's "Changing backends" on a resource
// fenced as README's example is: a row whose fence column a write must
// not be below (UPDATE ... WHERE id = $1 AND fence <= $2), on the test
// PostgreSQL. A real table rather than an in-process register, because the
// procedure's first step reads the highest fence the resource holds, and
// the statement is the one README gives users to copy.
//
// A deployment first takes its locks from Redis: two holders write, then a
// third takes the key and pauses before writing (a stale holder). The
// operator then finds the highest token issued (the resource's fence
// column, and Inspect on the old backend for the holder that has not
// written), stops the old deployment's Lockers, and opens the new
// backend's with token_base set to it. The new backend's holders' writes
// must be accepted, their tokens still increasing; the stale Redis
// holder's write, which comes later, and a stale holder of the new
// backend's, must be refused.
//
// Redis runs twice: with its plain counter (tokens from 1) and with
// clock_tokens=true (tokens near the clock in microseconds, about 1.8e15:
// the highest range any backend has, so that every other backend's own
// tokens are below it). WithoutTokenBase shows what the base prevents:
// after the switch from the clock-token Redis to a backend of a lower
// range without token_base, the new holder's writes are refused and the
// stale Redis holder's write is accepted.
func TestChangingBackends(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	redisAddr := testserver.Redis(t).Addr()
	for _, src := range []struct {
		name  string
		query string
	}{
		{"Redis", ""},
		{"RedisClockTokens", "clock_tokens=true"},
	} {
		for _, dst := range targets() {
			t.Run(src.name+"To"+dst.name, func(t *testing.T) {
				oldURL := "redis://" + redisAddr + "/0?" + join(src.query, "prefix=portability:"+random()+":")
				switchBackends(t, ctx, oldURL, dst.url(t), true)
			})
		}
	}
	t.Run("WithoutTokenBase", func(t *testing.T) {
		for _, dst := range targets() {
			t.Run(dst.name, func(t *testing.T) {
				if dst.clockRange {
					t.Skip("its own tokens are the database clock in microseconds, the range of Redis' clock tokens: no mismatch to show")
				}
				oldURL := "redis://" + redisAddr + "/0?" + join("clock_tokens=true", "prefix=portability:"+random()+":")
				switchBackends(t, ctx, oldURL, dst.url(t), false)
			})
		}
	})
}

// target is a backend a deployment may switch to.
type target struct {
	name string
	// url returns the URL of a fresh keyspace on the backend.
	url func(t *testing.T) string
	// clockRange: the backend's own tokens are in the range of Redis'
	// clock tokens (the database clock in microseconds).
	clockRange bool
}

func targets() []target {
	return []target{
		{name: "Etcd", url: func(t *testing.T) string {
			return "etcd://" + testserver.Etcd(t).Addr() + "/portability-" + random()
		}},
		{name: "Redlock", url: func(t *testing.T) string {
			var addrs []string
			for _, s := range testserver.RedisNodes(t, 3) {
				addrs = append(addrs, s.Addr())
			}
			return "redlock://" + strings.Join(addrs, ",") + "?prefix=portability:" + random() + ":"
		}},
		{name: "Postgres", url: func(t *testing.T) string {
			return withQuery(t, testserver.Postgres(t).DSN(), "", "prefix", "portability-"+random())
		}},
		{name: "ZooKeeper", url: func(t *testing.T) string {
			return "zookeeper://" + testserver.ZooKeeper(t).Addr() + "/portability-" + random()
		}},
		{name: "TablePostgreSQL", clockRange: true, url: func(t *testing.T) string {
			return withQuery(t, testserver.Postgres(t).DSN(), "postgres+table", "lock_table", "portability_locks")
		}},
		{name: "TableMariaDB", clockRange: true, url: func(t *testing.T) string {
			srv := testserver.MySQL(t)
			// go-sql-driver's DSN user:pass@tcp(addr)/db.
			cred, rest, _ := strings.Cut(srv.DSN(), "@")
			user, pass, _ := strings.Cut(cred, ":")
			_, db, _ := strings.Cut(rest, "/")
			db, _, _ = strings.Cut(db, "?")
			u := url.URL{Scheme: "mysql", User: url.UserPassword(user, pass), Host: srv.Addr(), Path: "/" + db, RawQuery: "lock_table=portability_locks"}
			return u.String()
		}},
		{name: "TableSQLite", clockRange: true, url: func(t *testing.T) string {
			return "sqlite://" + filepath.ToSlash(filepath.Join(t.TempDir(), "locks.db"))
		}},
		{name: "Memlock", url: func(t *testing.T) string { return "mem://portability-" + random() }},
	}
}

// switchBackends runs the switch from the deployment at oldURL to the one
// at newURL, with a resource of its own: with the procedure (withBase),
// the new holders' writes are accepted and the stale ones refused;
// without it, for a new backend of a lower range, the reverse.
func switchBackends(t *testing.T, ctx context.Context, oldURL, newURL string, withBase bool) {
	res := newResource(t, ctx)
	id := res.newRow(t, ctx)
	key := "order/" + id

	// The old deployment: two holders write in turn; a third takes the key
	// and pauses before its write.
	oldA, oldB := open(t, ctx, oldURL), open(t, ctx, oldURL)
	for i, l := range []locker.Locker{oldA, oldB} {
		h := acquire(t, ctx, l, key)
		if !res.write(t, ctx, id, h.Token(), "old holder "+strconv.Itoa(i)) {
			t.Fatalf("old holder %d's write (token %d) refused before any switch", i, h.Token())
		}
		release(t, ctx, h)
	}
	staleLocker := open(t, ctx, oldURL)
	stale := acquire(t, ctx, staleLocker, key, locker.WithTTL(time.Minute))
	t.Logf("old backend: stale holder's token %d, fence %d", stale.Token(), res.fence(t, ctx, id))

	// The procedure: the highest token issued is the larger of the
	// resource's highest fence and the old backend's tokens of the keys
	// still held (Inspect, what `locker status` shows); the old
	// deployment's Lockers stop; the new one gets token_base above it.
	highest := res.maxFence(t, ctx)
	in, ok := oldA.(locker.Inspector)
	if !ok {
		t.Fatalf("the old backend's Locker (%T) is no locker.Inspector", oldA)
	}
	info, err := in.Inspect(ctx, key)
	if err != nil {
		t.Fatalf("Inspect on the old backend: %v", err)
	}
	if !info.Held || info.Token != stale.Token() {
		t.Fatalf("Inspect on the old backend: held %v, token %d; want the stale holder's token %d", info.Held, info.Token, stale.Token())
	}
	highest = max(highest, info.Token)
	for _, l := range []locker.Locker{oldA, oldB} {
		if err := l.Close(); err != nil {
			t.Fatalf("stopping the old deployment: %v", err)
		}
	}
	t.Logf("the highest token issued: %d", highest)
	if withBase {
		newURL = withQuery(t, newURL, "", "token_base", strconv.FormatInt(highest, 10))
	}

	// The new deployment: each Locker another process.
	newA, newB := open(t, ctx, newURL), open(t, ctx, newURL)
	h1 := acquire(t, ctx, newA, key)
	accepted := res.write(t, ctx, id, h1.Token(), "new holder 1")
	t.Logf("new backend: first holder's token %d, write accepted: %v", h1.Token(), accepted)
	staleAccepted := res.write(t, ctx, id, stale.Token(), "stale old holder")
	if !withBase {
		// What the base prevents, on a backend whose own tokens are below
		// the old ones: the new holder locked out, the stale holder let in.
		if accepted {
			t.Errorf("without token_base the new holder's write (token %d, below the old backend's %d) was accepted: this scenario shows nothing", h1.Token(), highest)
		}
		if !staleAccepted {
			t.Errorf("without token_base the stale old holder's write (token %d) was refused: this scenario shows nothing", stale.Token())
		}
		release(t, ctx, h1)
		release(t, ctx, stale)
		return
	}
	if h1.Token() <= highest {
		t.Errorf("the new backend's first token %d is not above token_base %d", h1.Token(), highest)
	}
	if !accepted {
		t.Errorf("the new backend's first holder's write (token %d) was refused: the resource's fence is %d", h1.Token(), res.fence(t, ctx, id))
	}
	if staleAccepted {
		t.Errorf("the stale old holder's write (token %d) was accepted after the new holder's (token %d)", stale.Token(), h1.Token())
	}
	release(t, ctx, h1)
	release(t, ctx, stale)

	// Fencing goes on as before on the new backend.
	h2 := acquire(t, ctx, newB, key)
	if h2.Token() <= h1.Token() {
		t.Errorf("the new backend's next token %d is not above its previous %d", h2.Token(), h1.Token())
	}
	if !res.write(t, ctx, id, h2.Token(), "new holder 2") {
		t.Errorf("the new backend's second holder's write (token %d) was refused: the resource's fence is %d", h2.Token(), res.fence(t, ctx, id))
	}
	if res.write(t, ctx, id, h1.Token(), "stale new holder 1") {
		t.Errorf("the new backend's stale holder's write (token %d) was accepted after the next holder's (token %d)", h1.Token(), h2.Token())
	}
	release(t, ctx, h2)
}

// resource is README's fenced table on the test PostgreSQL.
type resource struct {
	conn  *pgx.Conn
	table string
}

func newResource(t *testing.T, ctx context.Context) *resource {
	t.Helper()
	conn, err := pgx.Connect(ctx, testserver.Postgres(t).DSN())
	if err != nil {
		t.Fatalf("connecting to PostgreSQL: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	r := &resource{conn: conn, table: "portability_orders_" + random()}
	if _, err := conn.Exec(ctx, "CREATE TABLE "+r.table+" (id text PRIMARY KEY, state text NOT NULL, fence bigint NOT NULL DEFAULT 0)"); err != nil {
		t.Fatalf("creating the resource: %v", err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP TABLE "+r.table) })
	return r
}

// newRow adds a row of its own for one test, with fence 0.
func (r *resource) newRow(t *testing.T, ctx context.Context) string {
	t.Helper()
	id := random()
	if _, err := r.conn.Exec(ctx, "INSERT INTO "+r.table+" (id, state) VALUES ($1, 'new')", id); err != nil {
		t.Fatalf("inserting a row: %v", err)
	}
	return id
}

// write is README's fenced write; it reports whether the row took it.
func (r *resource) write(t *testing.T, ctx context.Context, id string, token int64, state string) bool {
	t.Helper()
	tag, err := r.conn.Exec(ctx, "UPDATE "+r.table+" SET state = $3, fence = $2 WHERE id = $1 AND fence <= $2", id, token, state)
	if err != nil {
		t.Fatalf("writing with token %d: %v", token, err)
	}
	return tag.RowsAffected() == 1
}

func (r *resource) fence(t *testing.T, ctx context.Context, id string) int64 {
	t.Helper()
	var f int64
	if err := r.conn.QueryRow(ctx, "SELECT fence FROM "+r.table+" WHERE id = $1", id).Scan(&f); err != nil {
		t.Fatalf("reading the fence: %v", err)
	}
	return f
}

// maxFence is the procedure's look at the resource: the highest token it
// has accepted, on any row.
func (r *resource) maxFence(t *testing.T, ctx context.Context) int64 {
	t.Helper()
	var f int64
	if err := r.conn.QueryRow(ctx, "SELECT coalesce(max(fence), 0) FROM "+r.table).Scan(&f); err != nil {
		t.Fatalf("reading the highest fence: %v", err)
	}
	return f
}

func open(t *testing.T, ctx context.Context, raw string) locker.Locker {
	t.Helper()
	l, err := locker.Open(ctx, raw)
	if err != nil {
		t.Fatalf("locker.Open: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func acquire(t *testing.T, ctx context.Context, l locker.Locker, key string, opts ...locker.Option) locker.Handle {
	t.Helper()
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	h, err := l.Acquire(actx, key, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", key, err)
	}
	return h
}

func release(t *testing.T, ctx context.Context, h locker.Handle) {
	t.Helper()
	if err := h.Release(ctx); err != nil && !errors.Is(err, locker.ErrReleased) {
		t.Errorf("Release(%q): %v", h.Key(), err)
	}
}

// withQuery returns raw with parameter name set to value, and its scheme
// replaced by scheme unless that is empty.
func withQuery(t *testing.T, raw, scheme, name, value string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if scheme != "" {
		u.Scheme = scheme
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String()
}

func join(params ...string) string {
	var out []string
	for _, p := range params {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, "&")
}

func random() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
