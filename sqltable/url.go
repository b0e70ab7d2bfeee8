package sqltable

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/sqltable/internal/drivers"
)

// URL schemes registered with locker.Register.
const (
	SchemeSQLite       = "sqlite"
	SchemeMySQL        = "mysql"
	SchemePostgres     = "postgres+table"
	SchemePostgresLong = "postgresql+table"
)

// Our URL query parameters; each dialect's driver parameters are listed in
// the package documentation. (lock_file_mode, SQLite's, is read by
// sqltable/sqlite.)
const (
	paramTable  = "lock_table"     // WithTable
	paramNotify = "lock_notify"    // WithNotify
	paramConns  = "lock_max_conns" // the pool's SetMaxOpenConns
)

// Defaults of the pool a Locker opens for itself.
const (
	defaultMaxConns       = 10
	defaultSQLiteMaxConns = 4
)

// schemeDialects are the dialects of our schemes.
var schemeDialects = map[string]Dialect{
	SchemeSQLite:       SQLite,
	SchemeMySQL:        MySQL,
	SchemePostgres:     PostgreSQL,
	SchemePostgresLong: PostgreSQL,
}

// The schemes are registered here, not by the driver packages, so that a
// URL whose driver package was not imported gets an error that names the
// package, not only "unknown scheme".
func init() { backend.Register(openURL, SchemeSQLite, SchemeMySQL, SchemePostgres, SchemePostgresLong) }

// Open returns a Locker for a sqlite:, mysql:// or postgres+table:// URL
// (see the package documentation for their forms and parameters). The
// scheme's driver package (sqltable/sqlite, sqltable/mysql or sqltable/pgx)
// must be imported, else Open fails with an error wrapping
// locker.ErrUnknownScheme that names it. The Locker owns the *sql.DB it
// opens and closes it in Close. Open contacts no server; for SQLite it
// creates the database file (mode 0600 unless lock_file_mode says
// otherwise) and reports a missing or unwritable directory at once.
func Open(ctx context.Context, rawURL string) (*Locker, error) {
	u, err := backend.ParseURL("sqltable", rawURL)
	if err != nil {
		return nil, err
	}
	return openURL(ctx, u)
}

// urlOptions are the parameters common to every scheme.
type urlOptions struct {
	opts     []Option
	maxConns int
	err      error // a parameter of ours that no Option checks
}

func readCommon(q *backend.Query, scheme string, maxConns int) urlOptions {
	var uo urlOptions
	for _, set := range q.Shared(map[string]string{backend.ParamPrefix: "the lock table (lock_table, WithTable) is the keyspace"}) {
		uo.opts = append(uo.opts, func(c *config) error { return c.set(set) })
	}
	var table string
	if v, ok := q.Take(paramTable); ok {
		if v == "" {
			uo.err = fmt.Errorf("%w: %s: parameter %q is empty: name a table, or leave the parameter out for %q", locker.ErrInvalidURL, scheme, paramTable, DefaultTable)
		}
		table = v
	}
	uo.maxConns = maxConns
	q.Int(paramConns, &uo.maxConns, 1, 10000)
	if table != "" {
		uo.opts = append(uo.opts, WithTable(table))
	}
	return uo
}

// readNotify reads lock_notify.
func readNotify(q *backend.Query, uo *urlOptions) {
	notify := true
	q.Bool(paramNotify, &notify)
	if !notify {
		uo.opts = append(uo.opts, WithNotify(false))
	}
}

func openURL(_ context.Context, u *url.URL) (*Locker, error) {
	scheme := strings.ToLower(u.Scheme)
	d, ok := schemeDialects[scheme]
	if !ok {
		return nil, fmt.Errorf("%w: sqltable: unsupported scheme %q (want sqlite, mysql or postgres+table)", locker.ErrInvalidURL, scheme)
	}
	drv := drivers.Lookup(int(d))
	if drv == nil || drv.ParseURL == nil {
		return nil, fmt.Errorf("%w %q: its driver package is not imported: import _ %q (forgotten import?)", locker.ErrUnknownScheme, scheme, drivers.Packages[int(d)])
	}
	q, err := backend.ParseQuery(u)
	if err != nil {
		return nil, err
	}
	maxConns := defaultMaxConns
	if d == SQLite {
		maxConns = defaultSQLiteMaxConns
	}
	uo := readCommon(q, scheme, maxConns)
	readNotify(q, &uo)
	open, err := drv.ParseURL(u, q)
	if err != nil {
		return nil, err
	}
	if err := finish(q, scheme, d, uo); err != nil {
		return nil, err
	}
	db, err := open()
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(uo.maxConns)
	db.SetMaxIdleConns(uo.maxConns)
	l := New(db, uo.opts...)
	l.ownDB = true
	return l, nil
}

// finish rejects unknown parameters and invalid options.
func finish(q *backend.Query, scheme string, d Dialect, uo urlOptions) error {
	if err := q.Finish(); err != nil {
		return err
	}
	return checkOptions(scheme, d, uo)
}

// checkOptions rejects invalid options, and a table that d cannot share
// between connections.
func checkOptions(scheme string, d Dialect, uo urlOptions) error {
	if uo.err != nil {
		return uo.err
	}
	cfg, err := newConfig(uo.opts)
	if err == nil {
		t, _ := parseTable(cfg.table) // checked by WithTable
		err = checkTable(d, t)
	}
	if err != nil {
		return fmt.Errorf("%w: %s: %w", locker.ErrInvalidURL, scheme, err)
	}
	return nil
}
