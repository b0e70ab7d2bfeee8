// Package mysql is the MySQL and MariaDB driver package of sqltable:
// imported, it lets sqltable.New take a *sql.DB of
// github.com/go-sql-driver/mysql, and sqltable.Open and locker.Open take
// mysql:// URLs:
//
//	import _ "github.com/go-locker/locker/sqltable/mysql"
//
// It links github.com/go-sql-driver/mysql (which registers the
// database/sql driver "mysql") and nothing else.
package mysql

import (
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	// The package's URL schemes are registered with locker.Open by
	// sqltable: importing this package alone makes them work.
	_ "github.com/go-locker/locker/sqltable"
	"github.com/go-locker/locker/sqltable/internal/drivers"
)

func init() {
	drivers.Register(&drivers.Driver{
		Dialect:   drivers.MySQL,
		Package:   drivers.Packages[drivers.MySQL],
		Owns:      owns,
		ParseURL:  parseURL,
		Transient: transient,
		ConnGone:  connGone,
	})
}

func owns(d driver.Driver) bool {
	_, ok := d.(*gomysql.MySQLDriver)
	return ok
}

// transient reports deadlocks and lock-wait timeouts, which roll the
// statement back.
func transient(err error) bool {
	var me *gomysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
}

// connGone reports the driver's error for a connection found broken.
func connGone(err error) bool { return errors.Is(err, gomysql.ErrInvalidConn) }

// parseURL reads the driver parameters of a mysql:// URL; the returned
// function opens the pool.
func parseURL(u *url.URL, q *backend.Query) (func() (*sql.DB, error), error) {
	cfg, err := mysqlConfig(u, q)
	if err != nil {
		return nil, err
	}
	return func() (*sql.DB, error) {
		conn, err := gomysql.NewConnector(cfg)
		if err != nil {
			return nil, fmt.Errorf("%w: mysql: %s", locker.ErrInvalidURL, backend.RedactSecrets(err.Error(), cfg.Passwd))
		}
		return sql.OpenDB(conn), nil
	}, nil
}

// mysqlConfig turns mysql://user:pass@host:port/db into the driver's
// Config. The driver parameters it accepts are tls, timeout, readTimeout,
// writeTimeout, allowNativePasswords and allowCleartextPasswords; and ours,
// lock_tls_ca.
func mysqlConfig(u *url.URL, q *backend.Query) (*gomysql.Config, error) {
	cfg := gomysql.NewConfig()
	if u.Opaque != "" || u.Host == "" {
		return nil, fmt.Errorf("%w: mysql: want mysql://user:password@host:3306/database", locker.ErrInvalidURL)
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "3306"
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return nil, fmt.Errorf("%w: mysql: port %q is not a number from 1 to 65535", locker.ErrInvalidURL, port)
	}
	cfg.Net = "tcp"
	cfg.Addr = net.JoinHostPort(host, port)
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if cfg.DBName == "" || strings.Contains(cfg.DBName, "/") {
		return nil, fmt.Errorf("%w: mysql: the URL's path must name one database (mysql://user:password@host:3306/database)", locker.ErrInvalidURL)
	}
	q.Duration("timeout", &cfg.Timeout)
	q.Duration("readTimeout", &cfg.ReadTimeout)
	q.Duration("writeTimeout", &cfg.WriteTimeout)
	q.Bool("allowNativePasswords", &cfg.AllowNativePasswords)
	q.Bool("allowCleartextPasswords", &cfg.AllowCleartextPasswords)
	mode, hasMode := q.Take("tls")
	if hasMode {
		if !slices.Contains([]string{"true", "false", "skip-verify", "preferred"}, mode) {
			return nil, fmt.Errorf("%w: mysql: parameter \"tls\": %q is not true, false, skip-verify or preferred", locker.ErrInvalidURL, mode)
		}
		cfg.TLSConfig = mode
	}
	if caFile, ok := q.Take(paramTLSCA); ok {
		if hasMode && mode != "true" {
			return nil, fmt.Errorf("%w: mysql: %s with tls=%s: the CA file is for verifying the server (tls=true, which %s implies)", locker.ErrInvalidURL, paramTLSCA, mode, paramTLSCA)
		}
		tc, err := tlsWithCA(caFile, host)
		if err != nil {
			return nil, fmt.Errorf("%w: mysql: %w", locker.ErrInvalidURL, err)
		}
		cfg.TLSConfig, cfg.TLS = "", tc
	}
	return cfg, nil
}

// paramTLSCA names a PEM file of the CA certificates that sign the
// server's certificate: with it, the connection must use TLS and the
// server's certificate must chain to one of them and name the URL's host.
const paramTLSCA = "lock_tls_ca"

// tlsWithCA is the TLS configuration of lock_tls_ca: the CAs of file alone,
// and the host checked against the server's certificate.
func tlsWithCA(file, host string) (*tls.Config, error) {
	if file == "" {
		return nil, fmt.Errorf("parameter %q is empty: name a PEM file of the CA certificates that sign the server's", paramTLSCA)
	}
	pemData, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", paramTLSCA, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, fmt.Errorf("%s: %s holds no PEM certificate", paramTLSCA, file)
	}
	return &tls.Config{RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS12}, nil
}
