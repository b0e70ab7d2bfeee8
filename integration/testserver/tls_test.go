package testserver_test

import (
	"database/sql"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/go-locker/locker/integration/testserver"
)

// TestPostgresTLS: the TLS server answers over verify-full with its test CA,
// and refuses a connection without TLS and a wrong password.
func TestPostgresTLS(t *testing.T) {
	srv := testserver.PostgresTLS(t)
	if srv.TLS() == nil {
		t.Fatal("PostgresTLS has no TLS files")
	}
	ctx := ctxFor(t, time.Minute)
	conn, err := pgx.Connect(ctx, srv.DSN())
	if err != nil {
		t.Fatalf("connect over verify-full: %v", err)
	}
	defer conn.Close(ctx)
	var ssl bool
	if err := conn.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil || !ssl {
		t.Fatalf("pg_stat_ssl.ssl = %v, %v; want true", ssl, err)
	}
	u, _ := url.Parse(srv.DSN())
	q := u.Query()
	q.Set("sslmode", "disable")
	q.Del("sslrootcert")
	u.RawQuery = q.Encode()
	if c, err := pgx.Connect(ctx, u.String()); err == nil {
		c.Close(ctx)
		t.Fatal("a connection without TLS was taken")
	} else if !strings.Contains(err.Error(), "no encryption") && !strings.Contains(err.Error(), "pg_hba.conf rejects") {
		t.Errorf("without TLS: %v; want pg_hba's rejection", err)
	}
	u, _ = url.Parse(srv.DSN())
	u.User = url.UserPassword("locker", "not-the-password")
	if c, err := pgx.Connect(ctx, u.String()); err == nil {
		c.Close(ctx)
		t.Fatal("a wrong password was taken")
	} else if !strings.Contains(err.Error(), "password authentication failed") {
		t.Errorf("wrong password: %v", err)
	}
}

// TestMySQLTLS: the TLS server answers over TLS checked against its test CA,
// and refuses a connection without TLS.
func TestMySQLTLS(t *testing.T) {
	srv := testserver.MySQLTLS(t)
	if srv.TLS() == nil {
		t.Fatal("MySQLTLS has no TLS files")
	}
	ctx := ctxFor(t, time.Minute)
	db, err := sql.Open("mysql", srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var name, cipher string
	if err := db.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Ssl_cipher'").Scan(&name, &cipher); err != nil || cipher == "" {
		t.Fatalf("Ssl_cipher = %q, %v; want a cipher", cipher, err)
	}
	var v string
	if err := db.QueryRowContext(ctx, "SELECT @@require_secure_transport").Scan(&v); err != nil || v != "1" {
		t.Errorf("require_secure_transport = %q, %v; want 1", v, err)
	}
	cfg, _ := mysql.ParseDSN(srv.DSN())
	cfg.TLSConfig = "false"
	plain, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := plain.PingContext(ctx); err == nil {
		t.Fatal("a connection without TLS was taken")
	} else if !strings.Contains(err.Error(), "insecure transport") && !strings.Contains(err.Error(), "Error 1045") {
		// MariaDB 10.11 refuses it as a failed login (1045), 11.x names
		// the insecure transport.
		t.Errorf("without TLS: %v; want require_secure_transport's refusal", err)
	}
}
