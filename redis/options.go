package redis

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
	// DefaultPrefix namespaces every Redis key and channel the Locker uses.
	DefaultPrefix = "locker:"

	// DefaultRetryInterval is how long a waiter sleeps at most between two
	// attempts when no release notification arrives and the holder's lease
	// has not run out: the safety net for a lost Pub/Sub message (dropped
	// connection, failover, resharding). Notifications normally wake waiters
	// long before it.
	DefaultRetryInterval = 3 * time.Second
)

// config holds the Locker-level settings: those redlock has too
// (settings.Core), and this package's own.
type config struct {
	settings.Core
	clockTokens bool
	fenceExpiry time.Duration // 0: fence counters never expire
	replicas    int           // WithReplicaAck: replicas that must confirm; 0 off
	ackTimeout  time.Duration // WithReplicaAck: how long WAIT waits for them
}

func defaultConfig() config {
	return config{
		Core: settings.Core{
			Settings: backend.Settings{Prefix: DefaultPrefix, TTL: locker.DefaultTTL, RetryInterval: DefaultRetryInterval},
			Limits:   limits,
		},
	}
}

// Option configures a Locker. Options are checked by New; an invalid one makes
// every Acquire and TryAcquire of the Locker fail with an error wrapping
// locker.ErrInvalidOption (Open returns it at once). WithDefaultTTL,
// WithDriftMargin, WithPrefix, WithRetryInterval, WithoutWatchdog and
// WithTokenBase are the names every backend gives these settings (see
// backend.Settings); the others are this package's own.
type Option func(*config) error

// WithPrefix sets the prefix of every Redis key and Pub/Sub channel the
// Locker uses (default "locker:"; URL parameter prefix). Lockers that
// should exclude each other must use the same prefix. A prefix containing
// "{" changes which part of the name Redis Cluster hashes: the lock and
// its counter still land on one slot, but possibly the same slot for every
// key.
func WithPrefix(prefix string) Option {
	return func(c *config) error { return c.Set(backend.SetPrefix(prefix)) }
}

// WithDefaultTTL sets the lease of the Locker's locks taken without a
// per-call locker.WithTTL (default locker.DefaultTTL, within [locker.MinTTL, locker.MaxTTL]
// like every TTL; URL parameter ttl).
func WithDefaultTTL(ttl time.Duration) Option {
	return func(c *config) error { return c.Set(backend.SetDefaultTTL(ttl)) }
}

// WithoutWatchdog turns automatic renewal off (URL: watchdog=false). By
// default a held lock is extended every TTL/3 for as long as the Handle is
// held; without it the lease simply runs out after its TTL, and the Handle
// reports the loss (Done, ErrLost) a drift margin before that moment.
func WithoutWatchdog() Option {
	return func(c *config) error { return c.Set(backend.SetNoWatchdog()) }
}

// WithDriftMargin sets how long before the lease may have run out on the
// server the holder gives the lock up as lost (URL parameter
// drift_margin). The lease is measured on the local monotonic clock from
// the moment the last successful acquire or renewal request was sent, so
// network delay is already on the safe side; the margin covers the
// server's and the client's clocks running at slightly different rates,
// timer latency, and Redis' 1ms expiry granularity. The default is TTL/50
// + 100ms, but at most TTL/4: 2% for clock rates, and 100ms for stalls of
// the holder's process (CPU throttling in containers, timer and scheduling
// latency on a loaded machine). It must be below half the TTL of every
// lock.
func WithDriftMargin(d time.Duration) Option {
	return func(c *config) error { return c.Set(backend.SetDriftMargin(d)) }
}

// WithRetryInterval sets the longest a waiter sleeps between attempts when
// no notification arrives (default 3s, URL parameter retry_interval); see
// DefaultRetryInterval.
func WithRetryInterval(d time.Duration) Option {
	return func(c *config) error { return c.Set(backend.SetRetryInterval(d)) }
}

// WithTokenBase adds n to every token the Locker hands out (URL parameter
// token_base): Handle.Token and LockInfo.Token are n plus the fence
// counter's value. n must be within [0, locker.MaxTokenBase]; give every
// Locker of a deployment the same n, as the same prefix (see
// locker.MaxTokenBase, and README's "Changing backends" for when to set it).
func WithTokenBase(n int64) Option {
	return func(c *config) error { return c.Set(backend.SetTokenBase(n)) }
}

// newConfig applies opts to the defaults and checks the result.
func newConfig(opts []Option) (config, error) {
	cfg := defaultConfig()
	if err := settings.Apply(&cfg, opts); err != nil {
		return cfg, err
	}
	if err := cfg.Check(); err != nil {
		return cfg, err
	}
	if _, err := cfg.driftFor(cfg.TTL); err != nil {
		return cfg, err
	}
	if cfg.fenceExpiry > 0 && !cfg.clockTokens {
		return cfg, fmt.Errorf("%w: redis: WithFenceExpiry needs WithClockTokens: an expired plain counter would start again at 1, and tokens would go backwards", locker.ErrInvalidOption)
	}
	return cfg, nil
}

// WithClockTokens makes fencing tokens at least the Redis server's clock in
// microseconds: each token is max(previous token + 1, server time in µs)
// instead of a plain INCR. Tokens then keep increasing even when the fence
// counter is lost — a restart without persistence, FLUSHALL, eviction, a
// failover to a replica that missed the latest increments — provided the
// clock of the server that issues the next token is not behind the clock of
// the one that issued the last (NTP keeps that true by a wide margin for
// failovers that take seconds). The tokens are large numbers (about 1.8e15
// in 2026) rather than 1, 2, 3; they still fit an int64 and a JSON number.
// Lockers with and without it can share keys: tokens increase either way.
func WithClockTokens(on bool) Option {
	return func(c *config) error {
		c.clockTokens = on
		return nil
	}
}

// MinFenceExpiry is the shortest idle period accepted by WithFenceExpiry.
// After it the server clock must have passed the counter's last value, so
// the clock floor alone keeps tokens increasing: a minute is millions of
// microseconds of margin, far above what acquisitions in a burst add to the
// counter, and it also covers a small step back of the server clock.
const MinFenceExpiry = time.Minute

// MaxFenceExpiry is the longest idle period accepted by WithFenceExpiry: a
// year. Redis rejects an expiry whose milliseconds overflow its clock
// arithmetic.
const MaxFenceExpiry = 365 * 24 * time.Hour

// WithFenceExpiry lets a key's fence counter expire once the key has not been
// acquired for idle (at least MinFenceExpiry; hours or days are typical), so
// that Redis memory does not grow with every distinct key ever locked: by
// default counters never expire, one small key per lock name. It needs
// WithClockTokens, which keeps tokens increasing when a counter is gone,
// under the same condition as there: the clock of the server that issues the
// next token must not be behind the clock that issued the last one (by more
// than idle, here). Without WithClockTokens it is an invalid option. URL:
// fence_expiry=24h (with clock_tokens=true).
func WithFenceExpiry(idle time.Duration) Option {
	return func(c *config) error {
		if idle < MinFenceExpiry || idle > MaxFenceExpiry {
			return fmt.Errorf("%w: redis: fence expiry %v is outside [%v, %v]", locker.ErrInvalidOption, idle, MinFenceExpiry, MaxFenceExpiry)
		}
		c.fenceExpiry = idle
		return nil
	}
}

// WithAllowEviction turns off the check that the server's maxmemory-policy
// is noeviction (see ErrEvictionPolicy). Use it only for a Redis whose policy
// you cannot change, typically one shared with a cache, and only if you
// accept what eviction does to locks: under memory pressure Redis may delete
// a held lock, another client then acquires the key at once, and the holder
// hears of it only at its next renewal, up to a third of the TTL later
// (Done, ErrLost) — two holders in the meantime, which only fencing on the
// resource side catches. Under an allkeys-* policy the fence counter can be
// evicted too, and tokens then start again from 1 unless WithClockTokens is
// on, which you should set with this option. URL: allow_eviction=true.
func WithAllowEviction(on bool) Option {
	return func(c *config) error {
		c.AllowEviction = on
		return nil
	}
}

// limits are the package's checks of lease settings (see internal/lease).
var limits = lease.Limits{Backend: "redis"}

// driftFor returns the drift margin for a lock of the given TTL, or an error
// when the configured margin leaves too little of the lease.
func (c *config) driftFor(ttl time.Duration) (time.Duration, error) {
	return c.DriftFor(ttl)
}

// WithLogger sets where the Locker logs its events (no URL form): a
// renewal that failed and is retried, a lock at risk and cleared, a lock
// lost and why, a Pub/Sub connection replaced. Nil, the default, logs nothing. Keys
// are shown as errors show them; passwords never.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { return c.Set(backend.SetLogger(l)) }
}

// MaxReplicaAck is the largest replica count WithReplicaAck accepts.
const MaxReplicaAck = 64

// WithReplicaAck makes an acquisition, a renewal and the fence increment
// count only once n replicas have confirmed them (URL parameters
// replica_ack=n and replica_ack_timeout, default 1s): each acquire or
// renewal script is followed, in the same pipeline and so on the same
// connection and in the same round trip, by WAIT n timeout. An
// acquisition that fewer than n replicas confirmed within timeout is given
// back (guarded by the owner token) and fails with an error wrapping
// ErrNotReplicated; an Acquire does not wait on for a later turn. A
// renewal that fewer confirmed counts as failed: the lock is at risk, the
// renewal is retried, and the lock is lost if none is confirmed before
// the lease runs out. Releases are not confirmed (a release lost in a
// failover leaves the lock held until its lease ends, which is safe).
//
// What it buys: under Sentinel, a failover promotes the replica with the
// most recent data, so with n equal to the number of replicas (or with
// every replica but those that can never be promoted, replica-priority 0)
// the promoted replica has every lock and token the holders were told
// about, and tokens never repeat. What it cannot close: a replica that had
// not confirmed can still be promoted (n below the number of replicas, or
// Sentinel promoting one that fell behind), WAIT confirms that the write
// reached the replicas' memory, not their disks (both crashing at once
// loses it), and a write that was not confirmed is not undone on the
// replicas that did get it: the error says the lock was given back, and
// it was, on the master. See "Failure modes" in the package documentation
// and CHAOS.md for the measured effect.
//
// Cost: every acquire attempt (also one that only joins the queue) and
// every renewal waits for the replicas, about one replication round trip
// while they keep up, up to timeout while they do not.
//
// n is from 1 to MaxReplicaAck (0 turns the option off); timeout from 1ms
// to a minute, and below the client's ReadTimeout (go-redis v9.23 defaults to 5s), since
// the reply of the pipeline must come within it. It works with a single
// server client and a Sentinel failover client; a Cluster client is
// refused (the Locker reports an error wrapping locker.ErrInvalidOption).
// WAITAOF (Redis 7.2+, confirmation that the write reached the AOF) is not
// used.
func WithReplicaAck(n int, timeout time.Duration) Option {
	return func(c *config) error {
		if n < 0 || n > MaxReplicaAck {
			return fmt.Errorf("%w: redis: replica ack count %d is outside [0, %d]", locker.ErrInvalidOption, n, MaxReplicaAck)
		}
		if n > 0 && (timeout < time.Millisecond || timeout > time.Minute) {
			return fmt.Errorf("%w: redis: replica ack timeout %v is outside [1ms, 1m] (WAIT's 0, wait forever, is not allowed)", locker.ErrInvalidOption, timeout)
		}
		c.replicas, c.ackTimeout = n, timeout
		return nil
	}
}
