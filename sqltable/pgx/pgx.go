// Package pgx is the PostgreSQL driver package of sqltable: imported, it
// lets sqltable.New take a *sql.DB of pgx's database/sql driver
// (github.com/jackc/pgx/v5/stdlib, also behind a wrapper with
// sqltable.WithDialect(sqltable.PostgreSQL)), and sqltable.Open and
// locker.Open take postgres+table:// and postgresql+table:// URLs:
//
//	import _ "github.com/go-locker/locker/sqltable/pgx"
//
// It links pgx (whose stdlib package registers the database/sql driver
// "pgx") and nothing else. Through it the Locker runs its acquire
// statement on pgx itself and keeps one connection listening for the
// releases of other processes (see "Waiting" in package sqltable).
package pgx

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	pgxv5 "github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/pgrace"
	// The package's URL schemes are registered with locker.Open by
	// sqltable: importing this package alone makes them work.
	_ "github.com/go-locker/locker/sqltable"
	"github.com/go-locker/locker/sqltable/internal/drivers"
)

func init() {
	drivers.Register(&drivers.Driver{
		Dialect:     drivers.PostgreSQL,
		Package:     drivers.Packages[drivers.PostgreSQL],
		Owns:        owns,
		ParseURL:    parseURL,
		Transient:   transient,
		ConnGone:    connGone,
		RaceLost:    pgrace.Lost,
		QueryInt64:  queryInt64,
		SafeToRetry: pgconn.SafeToRetry,
		Listen:      listen,
	})
}

func owns(d driver.Driver) bool {
	_, ok := d.(*stdlib.Driver)
	return ok
}

// transient reports deadlocks and serialization failures, which roll the
// statement back.
func transient(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}

// connGone reports a FATAL error: the server ended the session
// (idle_session_timeout, shutdown).
func connGone(err error) bool {
	if errors.Is(err, pgconn.ErrConnClosed) {
		return true // a statement on a connection pgx had closed: not sent
	}
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Severity == "FATAL"
}

// conn returns pgx's connection behind dc, a connection of database/sql's
// Conn.Raw.
func conn(dc any) (*pgxv5.Conn, error) {
	sc, ok := dc.(*stdlib.Conn)
	if !ok {
		return nil, drivers.ErrNotOwn
	}
	return sc.Conn(), nil
}

// queryInt64 runs query on pgx itself: pgx watches the context with
// context.AfterFunc, where database/sql would start a goroutine per Rows
// of a cancellable context (see sqltable's acquireRaw).
func queryInt64(ctx context.Context, dc any, query string, args ...any) (int64, bool, error) {
	c, err := conn(dc)
	if err != nil {
		return 0, false, err
	}
	var v int64
	switch err := c.QueryRow(ctx, query, args...).Scan(&v); {
	case errors.Is(err, pgxv5.ErrNoRows):
		return 0, false, nil
	case err != nil:
		return 0, false, err
	}
	return v, true, nil
}

// listen returns the listening session of dc's server (see
// drivers.Driver.Listen): a pgx connection of its own, made with the
// settings of dc's (pgx.Conn.Config), on which setup (LISTEN) runs and
// whose notifications' payloads go to notify until ctx ends or the
// connection fails.
func listen(dc any) (func(ctx context.Context, setup []string, ready func(), notify func(string)) error, error) {
	c, err := conn(dc)
	if err != nil {
		return nil, err
	}
	cfg := c.Config()
	// The copy keeps dc's notification handler, which would take this
	// session's notifications away from WaitForNotification: without it
	// pgx buffers them for this connection.
	cfg.OnNotification = nil
	return func(ctx context.Context, setup []string, ready func(), notify func(string)) error {
		lc, err := pgxv5.ConnectConfig(ctx, cfg)
		if err != nil {
			return err
		}
		defer func() {
			// Bounded: on a dead link the Terminate message must not hang.
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = lc.Close(cctx)
		}()
		for _, stmt := range setup {
			if _, err := lc.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		ready()
		for {
			n, err := lc.WaitForNotification(ctx)
			if err != nil {
				return err
			}
			if n != nil {
				notify(n.Payload)
			}
		}
	}, nil
}

// pgParams are the driver parameters accepted in a postgres+table:// URL:
// pgconn's connection settings, pgx's own and the server run-time
// parameters pgx documents. Anything else would be sent to the server as a
// run-time parameter and fail each connection, so it is rejected at Open.
var pgParams = []string{
	"host", "port", "dbname", "database", "user", "password", "passfile",
	"connect_timeout", "target_session_attrs", "service", "servicefile",
	"sslmode", "sslkey", "sslcert", "sslcertmode", "sslrootcert",
	"sslnegotiation", "sslpassword", "sslsni", "krbspn", "krbsrvname",
	"min_protocol_version", "max_protocol_version", "channel_binding", "require_auth",
	"statement_cache_capacity", "description_cache_capacity", "default_query_exec_mode",
	"application_name", "options", "search_path", "timezone",
}

// parseURL checks the driver parameters of a postgres+table:// URL, which
// go to pgx as they are written, and pgx's parse of the URL; the returned
// function opens the pool.
func parseURL(u *url.URL, q *backend.Query) (func() (*sql.DB, error), error) {
	var unknown, ours []string
	for name := range q.Rest() {
		switch {
		case strings.HasPrefix(strings.ToLower(name), "lock_"):
			ours = append(ours, name)
		case !slices.Contains(pgParams, name):
			unknown = append(unknown, name)
		default:
			q.Has(name) // pgx's: known
		}
	}
	if len(ours)+len(unknown) > 0 {
		all := append(ours, unknown...)
		slices.Sort(all)
		return nil, fmt.Errorf("%w: %s: unknown parameter(s) %s (ours: ttl, drift_margin, retry_interval, ddl, watchdog, lock_table, lock_notify, lock_max_conns; pgx's: sslmode, connect_timeout, application_name, ... as listed in the package documentation)", locker.ErrInvalidURL, u.Scheme, strings.Join(all, ", "))
	}
	dsn := *u
	dsn.Scheme = "postgres"
	dsn.RawQuery = backend.StripShared(u.RawQuery, "lock_")
	password, _ := u.User.Password()
	cfg, err := pgxv5.ParseConfig(dsn.String())
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %s", locker.ErrInvalidURL, u.Scheme, backend.RedactSecrets(err.Error(), password))
	}
	return func() (*sql.DB, error) { return stdlib.OpenDB(*cfg), nil }, nil
}
