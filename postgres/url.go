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

// URL query parameters of our own. Every other parameter is left to pgx
// (libpq's connection parameters and pgxpool's pool_* settings).
const (
	paramNamespace      = "lock_namespace"       // WithNamespace
	paramHealthInterval = "lock_health_interval" // WithHealthCheckInterval, a Go duration
	paramSequence       = "lock_sequence"        // WithSequence
	paramDDL            = "lock_ddl"             // false: WithoutDDL
	paramSessionPooler  = "lock_session_pooler"  // true: WithSessionPooler
)

// ourPrefix marks parameters that belong to us: an unknown one is a typo,
// not something to pass on to the server as a run-time setting.
const ourPrefix = "lock_"

func init() {
	locker.Register("postgres", openURL)
	locker.Register("postgresql", openURL)
}

// openURL opens a Locker with a pool of its own, which its Close closes.
func openURL(ctx context.Context, u *url.URL) (locker.Locker, error) {
	q, err := backend.ParseQuery(u)
	if err != nil {
		return nil, err
	}
	var opts []Option
	if ns, ok := q.Take(paramNamespace); ok {
		opts = append(opts, WithNamespace(ns))
	}
	var interval time.Duration
	q.Duration(paramHealthInterval, &interval)
	if interval > 0 {
		opts = append(opts, WithHealthCheckInterval(interval))
	}
	if seq, ok := q.Take(paramSequence); ok {
		opts = append(opts, WithSequence(seq))
	}
	ddl := true
	q.Bool(paramDDL, &ddl)
	if !ddl {
		opts = append(opts, WithoutDDL())
	}
	var sessionPooler bool
	q.Bool(paramSessionPooler, &sessionPooler)
	if sessionPooler {
		opts = append(opts, WithSessionPooler())
	}
	if err := q.Err(); err != nil {
		return nil, err
	}
	rest := q.Rest()
	var unknown []string
	for name := range rest {
		if strings.HasPrefix(strings.ToLower(name), ourPrefix) {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return nil, fmt.Errorf("%w: %s: unknown parameter(s) %s (known: %s, %s, %s, %s, %s; other parameters go to pgx)",
			locker.ErrInvalidURL, u.Scheme, strings.Join(unknown, ", "),
			paramDDL, paramHealthInterval, paramNamespace, paramSequence, paramSessionPooler)
	}

	// Check our options before making a pool that would need closing.
	if cfg := newConfig(opts); cfg.err != nil {
		return nil, fmt.Errorf("%w: %s: %w", locker.ErrInvalidURL, u.Scheme, cfg.err)
	}

	dsn := *u
	dsn.RawQuery = rest.Encode()
	password, _ := u.User.Password()
	cfg, err := pgxpool.ParseConfig(dsn.String())
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %s", locker.ErrInvalidURL, u.Scheme, redact(err, password))
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %s", locker.ErrInvalidURL, u.Scheme, redact(err, password))
	}
	l := New(pool, opts...)
	// Fail now, not at the first lock, when the server cannot be reached or
	// refuses the credentials.
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: connecting to %s: %w", u.Redacted(), redactedError{redact(err, password), err})
	}
	l.ownsPool = true
	return l, nil
}

// redact returns err's message without the password. pgx already redacts
// connection strings in its parse errors; this is the belt to those braces.
func redact(err error, password string) string {
	msg := err.Error()
	if password != "" {
		msg = strings.ReplaceAll(msg, password, "xxxxx")
		if esc := url.QueryEscape(password); esc != password {
			msg = strings.ReplaceAll(msg, esc, "xxxxx")
		}
	}
	return msg
}

// redactedError shows a redacted message but keeps the original error for
// errors.Is and errors.As (context errors, *pgconn.PgError, ...).
type redactedError struct {
	msg string
	err error
}

func (e redactedError) Error() string { return e.msg }
func (e redactedError) Unwrap() error { return e.err }
