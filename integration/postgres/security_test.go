package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/integration/testserver"
)

// TestConformanceTLS runs the suite (testserver.SecurityCases; all with
// LOCKER_CONFORMANCE_FULL=1) over sslmode=verify-full, with the
// test CA as sslrootcert, against a server that takes TCP connections only
// over TLS and only with the right password (testserver.PostgresTLS).
func TestConformanceTLS(t *testing.T) {
	srv := testserver.PostgresTLS(t)
	if q := mustURL(t, srv.DSN()).Query(); q.Get("sslmode") != "verify-full" || q.Get("sslrootcert") == "" {
		t.Fatalf("the TLS server's DSN is not verify-full with a root certificate: %s", q.Encode())
	}
	h := conformanceHarness(t, srv, srv.DSN())
	h.Only = testserver.SecurityCases
	conformance.Run(t, h)
}

// TestTLSFailures: a wrong CA, a wrong password, and no TLS at all each fail
// the first call with the cause named, never repeating the password.
func TestTLSFailures(t *testing.T) {
	srv := testserver.PostgresTLS(t)
	admin := newPool(t, srv.DSN(), 2)
	role, secret := newRole(t, admin.Exec, "tls")
	t.Cleanup(func() { dropRole(admin.Exec, role) })
	ctx := testCtx(t)
	mustExec(t, ctx, admin.Exec, "CREATE SEQUENCE IF NOT EXISTS locker_fence AS bigint MINVALUE 1 NO CYCLE CACHE 1")
	mustExec(t, ctx, admin.Exec, "GRANT USAGE ON SEQUENCE locker_fence TO "+role)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "REVOKE ALL ON SEQUENCE locker_fence FROM "+role) })
	good := dsnAs(t, srv.DSN(), role, secret, "")
	other := testserver.NewTLSFiles(t) // a CA that did not sign the server's certificate
	const wrongPassword = "Wr0ng-pa55word-7d1f"
	cases := []struct {
		name, dsn string
		want      []string // all of them in the error
	}{
		{"wrong CA", withHost(t, good, "", url.Values{"sslrootcert": {other.CAFile}}),
			[]string{"certificate signed by unknown authority", "try-acquire"}},
		{"wrong password", dsnAs(t, srv.DSN(), role, wrongPassword, ""),
			[]string{"password authentication failed for user \"" + role + "\""}},
		{"no TLS", withHost(t, good, "", url.Values{"sslmode": {"disable"}}),
			[]string{"no encryption"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t)
			l, err := locker.Open(ctx, c.dsn)
			if err != nil {
				t.Fatalf("locker.Open: %v", err)
			}
			defer l.Close()
			h, err := l.TryAcquire(ctx, testKey(t, ""))
			if err == nil {
				_ = h.Release(ctx)
				t.Fatal("TryAcquire succeeded")
			}
			if errors.Is(err, locker.ErrNotAcquired) {
				t.Fatalf("TryAcquire: %v; want the connection's failure, not ErrNotAcquired", err)
			}
			msg := err.Error()
			t.Logf("the error: %s", msg)
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not say %q", msg, w)
				}
			}
			for _, s := range []string{secret, wrongPassword} {
				if strings.Contains(msg, s) {
					t.Errorf("error %q shows the password %q", msg, s)
				}
			}
		})
	}
	// The good settings work, for a role with a password of its own.
	l, err := locker.Open(ctx, good)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h, err := l.TryAcquire(ctx, testKey(t, ""))
	if err != nil {
		t.Fatalf("TryAcquire over verify-full as %s: %v", role, err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestConformanceLeastPrivilege runs the suite (testserver.SecurityCases) as a role with only
// the rights doc.go lists: LOGIN, CONNECT on the database, USAGE on the
// schema and USAGE on the existing token sequence, in a database where
// PUBLIC has nothing (no TEMP, no CREATE), with ddl=false.
func TestConformanceLeastPrivilege(t *testing.T) {
	srv := testserver.Postgres(t)
	// The suite's Process cases run this test again in child processes,
	// which must lock in the same database as the same role.
	dsn := os.Getenv(minDBEnv)
	if dsn == "" {
		dsn = newLeastPrivilegeDB(t, srv, grantAll).dsn
		t.Setenv(minDBEnv, dsn)
	}
	h := conformanceHarness(t, srv, withHost(t, dsn, "", url.Values{"ddl": {"false"}}))
	h.Only = testserver.SecurityCases
	conformance.Run(t, h)
}

// minDBEnv hands TestConformanceLeastPrivilege's DSN to its child processes.
const minDBEnv = "LOCKER_TEST_POSTGRES_LEAST_PRIVILEGE_DSN"

// TestLeastPrivilegeMissingRight: a role that lacks one of those rights
// fails its first call with the server's refusal, naming the object, wrapped
// with what the Locker was doing, and the key is not left locked.
func TestLeastPrivilegeMissingRight(t *testing.T) {
	srv := testserver.Postgres(t)
	cases := []struct {
		name  string
		grant grants
		want  []string
	}{
		{"no USAGE on the sequence", grantAll &^ grantSequence,
			[]string{"try-acquire", "may not use fencing-token sequence locker_fence", "GRANT USAGE ON SEQUENCE locker_fence TO "}},
		{"no USAGE on the schema", grantAll &^ grantSchema,
			[]string{"try-acquire", "fencing-token sequence locker_fence", "GRANT USAGE ON SCHEMA"}},
		{"no CONNECT on the database", grantAll &^ grantConnect,
			[]string{"permission denied for database"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db := newLeastPrivilegeDB(t, srv, c.grant)
			ctx := testCtx(t)
			key := testKey(t, "")
			l, err := locker.Open(ctx, db.dsn)
			if err != nil {
				t.Fatalf("locker.Open: %v", err)
			}
			defer l.Close()
			h, err := l.TryAcquire(ctx, key)
			if err == nil {
				_ = h.Release(ctx)
				t.Fatal("TryAcquire succeeded without the right")
			}
			msg := err.Error()
			t.Logf("the error: %s", msg)
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not say %q", msg, w)
				}
			}
			if strings.Contains(msg, db.secret) {
				t.Errorf("error %q shows the password", msg)
			}
			// The key is free: a role with every right takes it at once.
			full := newRoleIn(t, db, grantAll)
			lf, err := locker.Open(ctx, full)
			if err != nil {
				t.Fatal(err)
			}
			defer lf.Close()
			hf, err := lf.TryAcquire(ctx, key)
			if err != nil {
				t.Fatalf("TryAcquire by a role with the rights after the refused call: %v", err)
			}
			_ = hf.Release(ctx)
		})
	}
}

// grants are the rights newLeastPrivilegeDB gives its role.
type grants int

const (
	grantConnect  grants = 1 << iota // CONNECT on the database
	grantSchema                      // USAGE on schema public
	grantSequence                    // USAGE on the sequence locker_fence
	grantAll      = grantConnect | grantSchema | grantSequence
)

// leastPrivilegeDB is a database of its own, where PUBLIC has no rights,
// with the token sequence made by the admin, and a role of the test's.
type leastPrivilegeDB struct {
	srv      *testserver.Server
	name     string // the database
	adminDSN string // srv's superuser, on that database
	dsn      string // the role, on that database
	secret   string // the role's password
	roles    []string
}

func newLeastPrivilegeDB(t *testing.T, srv *testserver.Server, g grants) *leastPrivilegeDB {
	t.Helper()
	ctx := testCtx(t)
	admin := newPool(t, srv.DSN(), 2)
	db := &leastPrivilegeDB{srv: srv, name: fmt.Sprintf("locker_min_%d", time.Now().UnixNano())}
	mustExec(t, ctx, admin.Exec, "CREATE DATABASE "+db.name)
	// The database first, then its roles, whose rights end with it.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+db.name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", db.name, err)
		}
		for _, r := range db.roles {
			dropRole(admin.Exec, r)
		}
	})
	mustExec(t, ctx, admin.Exec, "REVOKE ALL ON DATABASE "+db.name+" FROM PUBLIC")
	db.adminDSN = dsnAs(t, srv.DSN(), "", "", db.name)
	conn, err := pgx.Connect(ctx, db.adminDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	mustExec(t, ctx, conn.Exec, "REVOKE ALL ON SCHEMA public FROM PUBLIC")
	mustExec(t, ctx, conn.Exec, "CREATE SEQUENCE locker_fence AS bigint MINVALUE 1 NO CYCLE CACHE 1")
	var role string
	role, db.secret = newRole(t, admin.Exec, "min")
	db.roles = append(db.roles, role)
	db.dsn = dsnAs(t, srv.DSN(), role, db.secret, db.name)
	grantTo(t, db, role, g)
	return db
}

// newRoleIn makes another role with rights g on db and returns its DSN.
func newRoleIn(t *testing.T, db *leastPrivilegeDB, g grants) string {
	t.Helper()
	role, secret := newRole(t, newPool(t, db.srv.DSN(), 1).Exec, "full")
	db.roles = append(db.roles, role)
	grantTo(t, db, role, g)
	return dsnAs(t, db.srv.DSN(), role, secret, db.name)
}

func grantTo(t *testing.T, db *leastPrivilegeDB, role string, g grants) {
	t.Helper()
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, db.adminDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if g&grantConnect != 0 {
		mustExec(t, ctx, conn.Exec, "GRANT CONNECT ON DATABASE "+db.name+" TO "+role)
	}
	if g&grantSchema != 0 {
		mustExec(t, ctx, conn.Exec, "GRANT USAGE ON SCHEMA public TO "+role)
	}
	if g&grantSequence != 0 {
		mustExec(t, ctx, conn.Exec, "GRANT USAGE ON SEQUENCE locker_fence TO "+role)
	}
}

type execFunc = func(context.Context, string, ...any) (pgconn.CommandTag, error)

// newRole makes a LOGIN role with a password of its own and nothing else.
func newRole(t *testing.T, admin execFunc, what string) (role, secret string) {
	t.Helper()
	n := time.Now().UnixNano()
	role = fmt.Sprintf("locker_%s_%d", what, n)
	secret = fmt.Sprintf("S3cret-%x", n)
	ctx := testCtx(t)
	mustExec(t, ctx, admin, "CREATE ROLE "+role+" LOGIN PASSWORD '"+secret+"'")
	return role, secret
}

func dropRole(admin execFunc, role string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = admin(ctx, "DROP ROLE IF EXISTS "+role)
}

func mustExec(t *testing.T, ctx context.Context, f execFunc, sql string) {
	t.Helper()
	if _, err := f(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// dsnAs returns dsn with user and password (when user is not empty) and the
// database (when db is not empty) replaced.
func dsnAs(t *testing.T, dsn, user, password, db string) string {
	t.Helper()
	u := mustURL(t, dsn)
	if user != "" {
		u.User = url.UserPassword(user, password)
	}
	if db != "" {
		u.Path = "/" + db
	}
	return u.String()
}

func mustURL(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("parse DSN: %v", err)
	}
	return u
}
