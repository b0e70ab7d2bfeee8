package sqltable

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/lease"
)

const (
	// DefaultRetryInterval is the longest a waiter sleeps between two tries
	// when nothing wakes it (see "Waiting" in the package documentation).
	DefaultRetryInterval = time.Second

	// MinPruneAge is the least age Prune accepts: fencing tokens stay
	// increasing across a Prune because a new row's first token is the
	// database clock in microseconds, which must have passed the deleted
	// row's last token (see "Fencing tokens").
	MinPruneAge = time.Minute
)

// config is the shared settings (backend.Settings: the default TTL, drift
// margin, retry interval, no-DDL and watchdog) and this package's own.
type config struct {
	backend.Settings
	dialect Dialect
	table   string
	notify  bool
}

func defaultConfig() config {
	return config{
		Settings: backend.Settings{TTL: locker.DefaultTTL, RetryInterval: DefaultRetryInterval},
		table:    DefaultTable,
		notify:   true,
	}
}

// set applies a shared setting, naming the package in its error.
func (c *config) set(s backend.Setting) error {
	if err := s(&c.Settings); err != nil {
		return fmt.Errorf("sqltable: %w", err)
	}
	return nil
}

// Option configures a Locker. An invalid option makes every call of the
// Locker fail with an error wrapping locker.ErrInvalidOption (Open returns
// it at once). WithDefaultTTL, WithDriftMargin, WithRetryInterval,
// WithoutDDL, WithoutWatchdog and WithTokenBase are the names every
// backend gives these settings (see backend.Settings); the others are this package's own.
type Option func(*config) error

// WithDialect names the SQL dialect instead of detecting it from the
// driver: for a driver that wraps one of the three supported ones.
func WithDialect(d Dialect) Option {
	return func(c *config) error {
		if d != PostgreSQL && d != MySQL && d != SQLite {
			return fmt.Errorf("%w: sqltable: unknown dialect %d", locker.ErrInvalidOption, int(d))
		}
		c.dialect = d
		return nil
	}
}

// WithTable sets the lock table's name (default "locker_locks"), optionally
// schema-qualified ("locks.app"). It must be ASCII letters, digits and
// underscores, not starting with a digit, at most 58 bytes per part; it is
// quoted, so its case is kept. The meta table is the same name with "_meta"
// appended. An unqualified name is qualified with its schema at the
// Locker's first call (see "The table" in the package documentation). A
// table in a temporary schema (SQLite's temp, PostgreSQL's pg_temp or
// pg_temp_N, in any case), where each connection would have one of its
// own, is refused by New with an error wrapping locker.ErrUnsafeConfig
// and locker.ErrInvalidOption.
func WithTable(name string) Option {
	return func(c *config) error {
		if _, err := parseTable(name); err != nil {
			return err
		}
		c.table = name
		return nil
	}
}

// WithDefaultTTL sets the lease of the Locker's locks taken without a
// per-call locker.WithTTL (default locker.DefaultTTL, within [locker.MinTTL, locker.MaxTTL]
// like every TTL; URL parameter ttl).
func WithDefaultTTL(ttl time.Duration) Option {
	return func(c *config) error { return c.set(backend.SetDefaultTTL(ttl)) }
}

// WithDriftMargin sets how long before the lease may have run out on the
// database the holder gives the lock up as lost (default TTL/50 + 100ms, at
// most TTL/4; URL parameter drift_margin). The lease is measured on the
// client's monotonic clock from the moment the last successful acquire or
// renewal was sent; the margin covers the two clocks running at slightly
// different rates and stalls of the holder's process. It must be below
// half the TTL of every lock.
func WithDriftMargin(d time.Duration) Option {
	return func(c *config) error { return c.set(backend.SetDriftMargin(d)) }
}

// WithRetryInterval sets the longest a waiter sleeps between two tries when
// no release wakes it (default 1s, URL parameter retry_interval; see
// "Waiting").
func WithRetryInterval(d time.Duration) Option {
	return func(c *config) error { return c.set(backend.SetRetryInterval(d)) }
}

// WithoutDDL stops the Locker from creating its tables (URL: ddl=false):
// they must exist (see DDL and the package documentation), and the Locker
// checks only their schema version.
func WithoutDDL() Option {
	return func(c *config) error { return c.set(backend.SetNoDDL()) }
}

// WithNotify turns on (the default) or off the wake-ups of this Locker's
// waiters by releases in other processes. On PostgreSQL the Locker then
// keeps one connection of the pool listening (LISTEN) from its first wait
// until Close (not while the pool is limited to fewer than four
// connections, SetMaxOpenConns, which one listener would starve; the limit
// is read when the connection is taken and watched while it is kept). On SQLite the process
// watches the signal file beside the database ("<file>-locker") from its
// first wait until its last Locker on the file closes (not on Windows,
// where waiters always back off). On MySQL and MariaDB the Locker rings
// each key's bell (a named lock on a connection of its own) once it has
// held the key for 5ms, and its waiters wait for the bells of other
// processes' holders (not while the pool is limited to fewer than four
// connections). On or off, the Locker's releases still notify (pg_notify,
// the signal file), for the waiters of other processes that listen; off, a
// MySQL Locker rings no bell. Without wake-ups its waiters retry with a
// back-off (see Waiting in the package documentation).
func WithNotify(on bool) Option {
	return func(c *config) error {
		c.notify = on
		return nil
	}
}

// WithoutWatchdog turns automatic renewal off (URL: watchdog=false): the
// lease simply runs out after its TTL, and the Handle reports the loss a
// drift margin before that.
func WithoutWatchdog() Option {
	return func(c *config) error { return c.set(backend.SetNoWatchdog()) }
}

// WithTokenBase adds n to every token the Locker hands out (URL parameter
// token_base): Handle.Token and LockInfo.Token are n plus the row's token;
// the row keeps its own (see "Fencing tokens" in the package
// documentation). n must be within [0, locker.MaxTokenBase]; give every
// Locker of a deployment the same n, as the same table (see
// locker.MaxTokenBase, and README's "Changing backends" for when to set it).
func WithTokenBase(n int64) Option {
	return func(c *config) error { return c.set(backend.SetTokenBase(n)) }
}

func newConfig(opts []Option) (config, error) {
	cfg := defaultConfig()
	if err := backend.Apply(&cfg, opts); err != nil {
		return cfg, err
	}
	if err := checkTTL(cfg.TTL); err != nil {
		return cfg, err
	}
	if _, err := cfg.driftFor(cfg.TTL); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// limits are the package's checks of lease settings (see internal/lease).
var limits = lease.Limits{Backend: "sqltable"}

func checkTTL(ttl time.Duration) error { return limits.Check(ttl) }

// driftFor returns the drift margin for a lock of the given TTL, or an error
// when the configured margin leaves too little of the lease.
func (c *config) driftFor(ttl time.Duration) (time.Duration, error) {
	return limits.Drift("drift margin", c.DriftMargin, ttl)
}

// lockTTL resolves the lease of one call from the per-call options: the
// TTL asked (or the default) rounded down to a whole microsecond, the unit
// the lock table's expiry is computed in, the nearest safe lease by
// locker's TTL rule. It is the lease the handle reports.
func (c *config) lockTTL(opts []locker.Option) (time.Duration, error) {
	ttl, err := limits.TTL(c.TTL, opts)
	return ttl.Truncate(time.Microsecond), err
}

// WithLogger sets where the Locker logs its events (no URL form): a
// renewal that failed and is retried, a lock at risk and cleared, a lock
// lost and why. Nil, the default, logs nothing. Keys
// are shown as errors show them; passwords never.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { return c.set(backend.SetLogger(l)) }
}
