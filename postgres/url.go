package postgres

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// URL query parameters of our own, removed before pgx sees the URL.
const (
	paramHealthInterval = "lock_health_interval" // WithHealthCheckInterval, a Go duration
	paramSequence       = "lock_sequence"        // WithSequence
	paramSessionPooler  = "lock_session_pooler"  // true: WithSessionPooler
)

// ourPrefix marks parameters that belong to us.
const ourPrefix = "lock_"

// pgxParams are the URL parameters handed to pgx: those it reads itself —
// pgconn's connection settings (as pgconn.ParseConfig lists them, "ssl" being
// the URL-only alias ssl=true for sslmode=require), pgx's and pgxpool's own
// — and the few server run-time parameters that pgx documents or takes from
// the environment, which it sends to the server at connect time.
//
// pgx sends every other parameter to the server as a run-time parameter,
// where a misspelt option ("pool_max_con", "ttl") fails each connection
// with FATAL: unrecognized configuration parameter — at the first lock, not
// at Open. So anything else is rejected; other server settings go, as with
// libpq, in options: options=-c%20statement_timeout%3D5s.
var pgxParams = []string{
	// pgconn
	"host", "port", "dbname", "database", "user", "password", "passfile",
	"connect_timeout", "target_session_attrs", "service", "servicefile",
	"ssl", "sslmode", "sslkey", "sslcert", "sslcertmode", "sslrootcert",
	"sslnegotiation", "sslpassword", "sslsni", "krbspn", "krbsrvname",
	"min_protocol_version", "max_protocol_version", "channel_binding", "require_auth",
	// pgx
	"statement_cache_capacity", "description_cache_capacity", "default_query_exec_mode",
	// pgxpool
	"pool_max_conns", "pool_min_conns", "pool_min_idle_conns", "pool_max_conn_lifetime",
	"pool_max_conn_lifetime_jitter", "pool_max_conn_idle_time", "pool_health_check_period",
	"pool_ping_timeout",
	// run-time parameters sent to the server
	"application_name", "options", "search_path", "timezone",
}

func init() {
	locker.Register("postgres", openURL)
	locker.Register("postgresql", openURL)
}

// openURL makes a Locker with a pool of its own, which its Close closes. It
// does not contact the server (as database/sql.Open, and the redis
// backend's Open): a wrong address or password, or a setting the server
// refuses, fails the first Acquire or TryAcquire.
func openURL(ctx context.Context, u *url.URL) (locker.Locker, error) {
	q, err := backend.ParseQuery(u)
	if err != nil {
		return nil, err
	}
	var opts []Option
	// The shared parameters (backend.Settings): prefix, ddl, ttl and
	// drift_margin set what WithPrefix, WithoutDDL, WithDefaultTTL and
	// WithDriftMargin do; retry_interval is checked and changes nothing
	// here (the server wakes waiters); watchdog=false is refused.
	for _, set := range q.Shared(map[string]string{backend.ParamWatchdog: "an advisory lock lasts as long as its session, which the Locker keeps alive"}) {
		opts = append(opts, func(c *config) error { return c.set(set) })
	}
	var interval time.Duration
	q.Duration(paramHealthInterval, &interval)
	if interval > 0 {
		opts = append(opts, WithHealthCheckInterval(interval))
	}
	if seq, ok := q.Take(paramSequence); ok {
		opts = append(opts, WithSequence(seq))
	}
	var sessionPooler bool
	q.Bool(paramSessionPooler, &sessionPooler)
	if sessionPooler {
		opts = append(opts, WithSessionPooler())
	}
	if err := q.Err(); err != nil {
		return nil, err
	}
	if err := checkPgxParams(u.Scheme, q.Rest()); err != nil {
		return nil, err
	}
	// Check our options before making a pool that would need closing.
	if cfg := newConfig(opts); cfg.err != nil {
		return nil, fmt.Errorf("%w: %s: %w", locker.ErrInvalidURL, u.Scheme, cfg.err)
	}

	dsn := *u
	dsn.RawQuery = backend.StripShared(u.RawQuery, ourPrefix) // the others exactly as written
	password, _ := u.User.Password()
	cfg, err := pgxpool.ParseConfig(dsn.String())
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %s", locker.ErrInvalidURL, u.Scheme, redact(err, password))
	}
	socks := newSockets()
	cfg.ConnConfig.DialFunc = socks.dialer(cfg.ConnConfig.DialFunc)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %s", locker.ErrInvalidURL, u.Scheme, redact(err, password))
	}
	l := New(pool, opts...)
	l.ownsPool = true
	l.sockets = socks
	return l, nil
}

// checkPgxParams rejects the parameters, other than ours, that are not in
// pgxParams. The error names them, never their values.
func checkPgxParams(scheme string, rest url.Values) error {
	var unknown, ours []string
	for name, vals := range rest {
		switch {
		case strings.HasPrefix(strings.ToLower(name), ourPrefix):
			ours = append(ours, name)
		case !slices.Contains(pgxParams, name):
			unknown = append(unknown, name)
		case name == "ssl" && slices.ContainsFunc(vals, func(v string) bool { return v != "true" }):
			return fmt.Errorf("%w: %s: parameter \"ssl\": only ssl=true (the same as sslmode=require) is understood; use sslmode", locker.ErrInvalidURL, scheme)
		}
	}
	if len(ours) > 0 {
		slices.Sort(ours)
		return fmt.Errorf("%w: %s: unknown parameter(s) %s (ours are %s, %s and %s, and the shared %s)",
			locker.ErrInvalidURL, scheme, strings.Join(ours, ", "),
			paramHealthInterval, paramSequence, paramSessionPooler, strings.Join(backend.SharedParams, ", "))
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return fmt.Errorf("%w: %s: unknown parameter(s) %s: neither ours (lock_*) nor one that pgx reads (sslmode, connect_timeout, pool_max_conns, application_name, ...; see the package documentation); set other server settings with options, e.g. options=-c%%20statement_timeout%%3D5s",
			locker.ErrInvalidURL, scheme, strings.Join(unknown, ", "))
	}
	return nil
}

// redact returns err's message without the password. pgx already redacts
// connection strings in its parse errors; this is the belt to those braces.
func redact(err error, password string) string { return backend.RedactSecrets(err.Error(), password) }
