package sqltable

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// URL schemes registered with locker.Register.
const (
	SchemeSQLite       = "sqlite"
	SchemeMySQL        = "mysql"
	SchemePostgres     = "postgres+table"
	SchemePostgresLong = "postgresql+table"
)

// Our URL query parameters; each dialect's driver parameters are listed in
// the package documentation.
const (
	paramTable    = "lock_table"     // WithTable
	paramNotify   = "lock_notify"    // WithNotify
	paramConns    = "lock_max_conns" // the pool's SetMaxOpenConns
	paramFileMode = "lock_file_mode" // SQLite: permissions of a new database file, octal
)

// Defaults of the pool a Locker opens for itself.
const (
	defaultMaxConns       = 10
	defaultSQLiteMaxConns = 4
	// DefaultFileMode is the permission of an SQLite database file that Open
	// creates: readable and writable by its owner only, as the file says who
	// holds what.
	DefaultFileMode = 0o600
	// sqliteBusyTimeout is how long SQLite itself waits for another writer
	// before it returns SQLITE_BUSY, which the Locker then retries within
	// the caller's context: short, so a cancelled call returns promptly.
	sqliteBusyTimeout = 50
)

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

func init() { backend.Register(openURL, SchemeSQLite, SchemeMySQL, SchemePostgres, SchemePostgresLong) }

// Open returns a Locker for a sqlite:, mysql:// or postgres+table:// URL
// (see the package documentation for their forms and parameters). The
// Locker owns the *sql.DB it opens and closes it in Close. Open contacts no
// server; for SQLite it creates the database file (mode 0600 unless
// lock_file_mode says otherwise) and reports a missing or unwritable
// directory at once.
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
	q, err := backend.ParseQuery(u)
	if err != nil {
		return nil, err
	}
	var (
		db *sql.DB
		uo urlOptions
	)
	switch scheme {
	case SchemeSQLite:
		uo = readCommon(q, scheme, defaultSQLiteMaxConns)
		readNotify(q, &uo)
		mode := DefaultFileMode
		if v, ok := q.Take(paramFileMode); ok {
			m, err := strconv.ParseUint(v, 8, 32)
			if err != nil || m > 0o777 || m&0o600 != 0o600 {
				return nil, fmt.Errorf("%w: sqlite: parameter %q: %q is not an octal file mode from 0600 to 0777 that lets its owner read and write", locker.ErrInvalidURL, paramFileMode, v)
			}
			mode = int(m)
		}
		if err := finish(q, SQLite, uo); err != nil {
			return nil, err
		}
		db, err = openSQLite(u, os.FileMode(mode))
	case SchemeMySQL:
		uo = readCommon(q, scheme, defaultMaxConns)
		readNotify(q, &uo)
		cfg, cerr := mysqlConfig(u, q)
		if cerr != nil {
			return nil, cerr
		}
		if err := finish(q, MySQL, uo); err != nil {
			return nil, err
		}
		conn, cerr := mysql.NewConnector(cfg)
		if cerr != nil {
			return nil, fmt.Errorf("%w: mysql: %s", locker.ErrInvalidURL, redact(cerr, cfg.Passwd))
		}
		db = sql.OpenDB(conn)
	case SchemePostgres, SchemePostgresLong:
		uo = readCommon(q, scheme, defaultMaxConns)
		readNotify(q, &uo)
		if err := q.Err(); err != nil {
			return nil, err
		}
		if err := checkOptions(scheme, PostgreSQL, uo); err != nil {
			return nil, err
		}
		db, err = openPostgres(u, q)
	default:
		return nil, fmt.Errorf("%w: sqltable: unsupported scheme %q (want sqlite, mysql or postgres+table)", locker.ErrInvalidURL, scheme)
	}
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
func finish(q *backend.Query, d Dialect, uo urlOptions) error {
	if err := q.Finish(); err != nil {
		return err
	}
	return checkOptions("sqltable", d, uo)
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

// sqlitePath returns the file of a sqlite: URL: sqlite:///abs/path.db,
// sqlite:/abs/path.db or sqlite:relative/path.db.
func sqlitePath(u *url.URL) (string, error) {
	var p string
	switch {
	case u.Opaque != "":
		var err error
		if p, err = url.PathUnescape(u.Opaque); err != nil {
			return "", fmt.Errorf("%w: sqlite: bad escape in the path", locker.ErrInvalidURL)
		}
	case u.Host != "":
		return "", fmt.Errorf("%w: sqlite: URL has a host %q; write sqlite:///absolute/path.db or sqlite:relative/path.db", locker.ErrInvalidURL, u.Host)
	default:
		p = u.Path
	}
	switch {
	case p == "":
		return "", fmt.Errorf("%w: sqlite: URL names no database file (want sqlite:///absolute/path.db or sqlite:relative/path.db)", locker.ErrInvalidURL)
	case p == ":memory:" || strings.HasPrefix(p, "file:") || strings.Contains(p, "mode=memory"):
		return "", fmt.Errorf("%w: %w: sqlite: %q: an in-memory database is private to one connection and cannot be shared; name a file", locker.ErrInvalidURL, locker.ErrUnsafeConfig, p)
	case strings.ContainsAny(p, "?#\x00"):
		return "", fmt.Errorf("%w: sqlite: the path %q contains '?', '#' or NUL, which the driver cannot take", locker.ErrInvalidURL, p)
	case strings.HasSuffix(p, "/"):
		return "", fmt.Errorf("%w: sqlite: the path %q names a directory, not a database file", locker.ErrInvalidURL, p)
	}
	return filepath.Clean(p), nil
}

// openSQLite checks the database file's directory, creates the file with
// mode if it is missing, and opens it in WAL mode with a busy timeout.
func openSQLite(u *url.URL, mode os.FileMode) (*sql.DB, error) {
	path, err := sqlitePath(u)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	switch {
	case os.IsNotExist(err):
		return nil, fmt.Errorf("sqltable: sqlite: the directory %q of the database file does not exist", dir)
	case err != nil:
		return nil, fmt.Errorf("sqltable: sqlite: the directory of the database file: %w", err)
	case !fi.IsDir():
		return nil, fmt.Errorf("sqltable: sqlite: %q, the directory of the database file, is not a directory", dir)
	}
	// SQLite needs to create the -wal and -shm files beside the database.
	probe, err := os.CreateTemp(dir, ".sqltable-probe-*")
	if err != nil {
		return nil, fmt.Errorf("sqltable: sqlite: the directory %q of the database file is not writable (SQLite creates its -wal and -shm files there): %w", dir, err)
	}
	probe.Close()
	os.Remove(probe.Name())
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, mode)
	switch {
	case err == nil:
		// Exactly mode, whatever the umask.
		cerr := f.Chmod(mode)
		f.Close()
		if cerr != nil {
			return nil, fmt.Errorf("sqltable: sqlite: set the mode of the new database file: %w", cerr)
		}
	case os.IsExist(err):
		fi, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("sqltable: sqlite: %w", err)
		}
		if fi.IsDir() {
			return nil, fmt.Errorf("sqltable: sqlite: %q is a directory, not a database file", path)
		}
	default:
		return nil, fmt.Errorf("sqltable: sqlite: create the database file: %w", err)
	}
	dsn := path + "?_pragma=busy_timeout(" + strconv.Itoa(sqliteBusyTimeout) + ")&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
	return sql.Open("sqlite", dsn)
}

// mysqlConfig turns mysql://user:pass@host:port/db into the driver's
// Config. The driver parameters it accepts are tls, timeout, readTimeout,
// writeTimeout, allowNativePasswords and allowCleartextPasswords.
func mysqlConfig(u *url.URL, q *backend.Query) (*mysql.Config, error) {
	cfg := mysql.NewConfig()
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
	if v, ok := q.Take("tls"); ok {
		if !slices.Contains([]string{"true", "false", "skip-verify", "preferred"}, v) {
			return nil, fmt.Errorf("%w: mysql: parameter \"tls\": %q is not true, false, skip-verify or preferred", locker.ErrInvalidURL, v)
		}
		cfg.TLSConfig = v
	}
	return cfg, nil
}

// openPostgres opens a pgx stdlib pool for a postgres+table:// URL.
func openPostgres(u *url.URL, q *backend.Query) (*sql.DB, error) {
	var unknown, ours []string
	for name := range q.Rest() {
		switch {
		case strings.HasPrefix(strings.ToLower(name), "lock_"):
			ours = append(ours, name)
		case !slices.Contains(pgParams, name):
			unknown = append(unknown, name)
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
	cfg, err := pgx.ParseConfig(dsn.String())
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %s", locker.ErrInvalidURL, u.Scheme, redact(err, password))
	}
	return stdlib.OpenDB(*cfg), nil
}

// redact returns err's message without the password.
func redact(err error, password string) string { return backend.RedactSecrets(err.Error(), password) }
