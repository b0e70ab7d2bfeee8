package redlock

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/lease"
	"github.com/go-locker/locker/redis/internal/settings"
)

const (
	// DefaultPrefix namespaces every Redis key and channel the Locker uses
	// on its nodes. It differs from the single-node backend's "locker:", so
	// a node shared by both keeps their locks apart.
	DefaultPrefix = "locker:redlock:"

	// DefaultRetryInterval is the longest a waiter sleeps between two
	// rounds when no release notification arrives: the safety net for a lost
	// Pub/Sub message. A waiter also wakes when the holder's lease on a
	// majority of nodes runs out, which is usually sooner.
	DefaultRetryInterval = time.Second

	// MaxNodeTimeout and MinNodeTimeout bound the default node timeout,
	// which is a tenth of the TTL (see WithNodeTimeout). The upper bound is
	// generous for a healthy network (the Redlock description suggests
	// milliseconds); it keeps a loaded client, whose first requests also pay
	// for dialling, from counting live nodes as down.
	MaxNodeTimeout = 3 * time.Second
	MinNodeTimeout = 50 * time.Millisecond
)

// config holds the Locker-level settings: those the redis package has too
// (settings.Core), and the node timeout.
type config struct {
	settings.Core
	nodeTimeout time.Duration // 0: derived from the TTL, see timing
}

func defaultConfig() config {
	return config{Core: settings.Core{
		Settings: backend.Settings{Prefix: DefaultPrefix, TTL: locker.DefaultTTL, RetryInterval: DefaultRetryInterval},
		Limits:   limits,
	}}
}

// Option configures a Locker. New checks the options; an invalid one is
// reported by Locker.Err and by every Acquire and TryAcquire, with an error
// wrapping locker.ErrInvalidOption (Open returns it at once).
// WithDefaultTTL, WithDriftMargin, WithPrefix, WithRetryInterval and
// WithTokenBase are the names every backend gives these settings (see
// backend.Settings); the others are this package's own.
type Option func(*config) error

// WithPrefix sets the prefix of every Redis key and Pub/Sub channel the
// Locker uses on its nodes (default DefaultPrefix; URL parameter prefix).
// Lockers that should exclude each other must use the same prefix and the
// same nodes.
func WithPrefix(prefix string) Option {
	return func(c *config) error { return c.Set(backend.SetPrefix(prefix)) }
}

// WithDefaultTTL sets the lease of the Locker's locks taken without a
// per-call locker.WithTTL (default locker.DefaultTTL, within [locker.MinTTL, locker.MaxTTL]
// like every TTL; URL parameter ttl).
func WithDefaultTTL(ttl time.Duration) Option {
	return func(c *config) error { return c.Set(backend.SetDefaultTTL(ttl)) }
}

// WithDriftMargin sets the clock-drift allowance of the Redlock validity
// computation: a lock acquired by a round whose first request left at t is
// taken to be held until t + TTL − drift on the client's monotonic clock,
// and renewals move that point the same way. It covers the nodes' clocks
// running faster than the client's (Redis expires keys by its own clock),
// timer latency, Redis' 1ms expiry granularity and short stalls of the
// holder's process. The default is TTL/50 + 100ms, at most TTL/4: 2% for
// clock rates (the Redlock description suggests 1% plus a few
// milliseconds) and 100ms for stalls on a loaded machine. It must be below
// half the TTL of every lock. URL parameter drift_margin.
func WithDriftMargin(d time.Duration) Option {
	return func(c *config) error { return c.Set(backend.SetDriftMargin(d)) }
}

// WithNodeTimeout sets how long one request to one node may take before
// the node counts as not answering in that round (acquire, write-back,
// renewal, release). It must be small against the TTL: a node that does not
// answer must not eat the lease the others granted. The default is a tenth
// of the lock's TTL, between MinNodeTimeout and MaxNodeTimeout; a given
// value must be at most a third of the TTL of every lock. A node that is
// down but still accepts connections (paused, cut off) costs every round
// this long.
func WithNodeTimeout(d time.Duration) Option {
	return func(c *config) error {
		if err := limits.AtLeast("node timeout", d, time.Millisecond); err != nil {
			return err
		}
		c.nodeTimeout = d
		return nil
	}
}

// WithRetryInterval sets the longest a waiter sleeps between rounds when no
// notification arrives (default DefaultRetryInterval; URL parameter
// retry_interval).
func WithRetryInterval(d time.Duration) Option {
	return func(c *config) error { return c.Set(backend.SetRetryInterval(d)) }
}

// WithTokenBase adds n to every token the Locker hands out (URL parameter
// token_base): Handle.Token and LockInfo.Token are n plus the token the
// nodes' counters give (see "Fencing tokens" in the package
// documentation). n must be within [0, locker.MaxTokenBase]; give every
// Locker of a deployment the same n, as the same prefix (see
// locker.MaxTokenBase, and README's "Changing backends" for when to set it).
func WithTokenBase(n int64) Option {
	return func(c *config) error { return c.Set(backend.SetTokenBase(n)) }
}

// WithAllowEviction turns off the check that every node's maxmemory-policy
// is noeviction (see ErrEvictionPolicy), as the redis package's option of
// the same name does. Use it only for nodes whose policy you cannot change,
// typically shared with a cache, and only if you accept what eviction does
// to locks: a node under memory pressure may delete a held lock (on a
// majority, another client then acquires the key while the holder hears of
// it only at its next renewal) and, under an allkeys-* policy, a fencing
// counter, after which tokens can go backwards (see "Fencing tokens" in the
// package documentation). URL: allow_eviction=true. The check that no two
// nodes are one server stays on.
func WithAllowEviction(on bool) Option {
	return func(c *config) error {
		c.AllowEviction = on
		return nil
	}
}

func newConfig(opts []Option) (config, error) {
	cfg := defaultConfig()
	if err := settings.Apply(&cfg, opts); err != nil {
		return cfg, err
	}
	if err := cfg.Check(); err != nil {
		return cfg, err
	}
	if _, err := cfg.timing(cfg.TTL); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// limits are the package's lease bounds (see internal/lease).
var limits = lease.Limits{Backend: "redlock"}

// timing is what one lock of a given TTL runs with.
type timing struct {
	ttl         time.Duration
	drift       time.Duration
	nodeTimeout time.Duration
	minValidity time.Duration // an acquisition must leave at least this
	desc        string        // the holder's locker.WithOwner description (a mutex's only)
}

// timing derives the drift, node timeout and minimum validity for ttl, or
// reports a configured value that does not fit it.
func (c *config) timing(ttl time.Duration) (timing, error) {
	d, err := c.DriftFor(ttl)
	if err != nil {
		return timing{}, err
	}
	nt := c.nodeTimeout
	if nt == 0 {
		nt = min(max(ttl/10, MinNodeTimeout), MaxNodeTimeout)
	}
	if nt > ttl/3 {
		return timing{}, fmt.Errorf("%w: redlock: node timeout %v is above a third of the TTL %v", locker.ErrInvalidOption, nt, ttl)
	}
	return timing{ttl: ttl, drift: d, nodeTimeout: nt, minValidity: ttl / 10}, nil
}

// lockTiming resolves the timing of one call from its options.
func (c *config) lockTiming(opts []locker.Option) (timing, error) {
	ttl, err := c.LockTTL(opts)
	if err != nil {
		return timing{}, err
	}
	tm, err := c.timing(ttl)
	tm.desc = backend.Owner(opts)
	return tm, err
}

// WithLogger sets where the Locker logs its events (no URL form): a
// renewal that failed and is retried, a lock at risk and cleared, a lock
// lost and why. Nil, the default, logs nothing. Keys
// are shown as errors show them; passwords never.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { return c.Set(backend.SetLogger(l)) }
}
