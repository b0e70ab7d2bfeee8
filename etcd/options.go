package etcd

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// DefaultPrefix is the etcd key prefix under which the lock directories live
// unless WithPrefix says otherwise.
const DefaultPrefix = "/locker"

// MinDriftMargin is the least margin the Locker keeps between declaring a
// lease lost and the earliest moment the server could expire it; see
// WithDriftMargin.
const MinDriftMargin = 50 * time.Millisecond

// Option configures a Locker made by New. WithDefaultTTL, WithDriftMargin,
// WithPrefix and WithTokenBase are the names every backend gives these
// settings (see backend.Settings).
type Option func(*config) error

// config is the shared settings (backend.Settings: the default TTL, the
// drift margin, 0 for TTL/10 at least MinDriftMargin, and the prefix) and
// every invalid option.
type config struct {
	backend.Settings
	err error
}

func newConfig(opts []Option) config {
	c := config{Settings: backend.Settings{Prefix: DefaultPrefix, TTL: locker.DefaultTTL}}
	c.err = backend.Apply(&c, opts)
	return c
}

// driftMargin is how long before the earliest possible server-side expiry
// of a lease of the given TTL the Locker reports its locks lost.
func (c *config) driftMargin(ttl time.Duration) time.Duration {
	if c.DriftMargin > 0 {
		return min(c.DriftMargin, ttl/2)
	}
	return max(ttl/10, MinDriftMargin)
}

// checkTTL rejects a TTL outside the portable range, as every backend does.
func checkTTL(ttl time.Duration) error { return backend.CheckTTL("etcd", ttl) }

// leaseSeconds is the TTL asked of etcd for ttl: etcd counts lease TTLs in
// whole seconds, so it is rounded down, the nearest safe lease by locker's
// TTL rule (a shorter lease, never a longer one), and at least a second
// (the portable range starts there). The server may grant more than it is
// asked, up to its own minimum (one and a half election timeouts, rounded
// up: 2s with the default --election-timeout=1000); the Locker then reports
// (Handle.TTL) and times its renewals and losses by the TTL the server
// granted.
func leaseSeconds(ttl time.Duration) int64 {
	return max(int64(ttl/time.Second), 1)
}

// checkPrefix rejects a prefix that is empty or ends in '/': the lock
// directories are <prefix>/<encoded key>/.
func checkPrefix(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("%w: empty prefix", locker.ErrInvalidOption)
	case strings.HasSuffix(p, "/"):
		return fmt.Errorf("%w: prefix %q ends in '/'", locker.ErrInvalidOption, p)
	case strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("%w: prefix contains a NUL byte", locker.ErrInvalidOption)
	}
	return nil
}

// WithPrefix sets the etcd key prefix of the lock directories (default
// DefaultPrefix, "/locker"; in a URL its path, or the parameter prefix).
// Every Locker that locks the same keys must use the same prefix. It must
// not be empty or end in '/'.
func WithPrefix(prefix string) Option {
	return func(c *config) error {
		if err := checkPrefix(prefix); err != nil {
			return fmt.Errorf("etcd: WithPrefix: %w", err)
		}
		c.Prefix = prefix
		return nil
	}
}

// WithDefaultTTL sets the lease of locks taken without locker.WithTTL
// (default locker.DefaultTTL; URL parameter ttl). It must be within [locker.MinTTL,
// locker.MaxTTL], like every TTL; it is rounded down to a whole second.
func WithDefaultTTL(ttl time.Duration) Option {
	return func(c *config) error {
		if err := checkTTL(ttl); err != nil {
			return fmt.Errorf("etcd: WithDefaultTTL: %w", err)
		}
		c.TTL = ttl
		return nil
	}
}

// WithTokenBase adds n to every token the Locker hands out (URL parameter
// token_base): Handle.Token and LockInfo.Token are n plus the holder key's
// create revision. n must be within [0, locker.MaxTokenBase]; give every
// Locker of a deployment the same n, as the same prefix (see
// locker.MaxTokenBase, and README's "Changing backends" for when to set it).
func WithTokenBase(n int64) Option {
	return func(c *config) error {
		if err := backend.SetTokenBase(n)(&c.Settings); err != nil {
			return fmt.Errorf("etcd: %w", err)
		}
		return nil
	}
}

// WithDriftMargin sets how long before the earliest moment the server could
// expire a lease that was not renewed the Locker reports its locks lost
// (default: a tenth of the TTL, at least MinDriftMargin; never more than
// half the TTL). It covers clock rate differences between client and
// leader. URL parameter drift_margin.
func WithDriftMargin(d time.Duration) Option {
	return func(c *config) error {
		if d < MinDriftMargin {
			return fmt.Errorf("etcd: WithDriftMargin: %w: %v is below %v", locker.ErrInvalidOption, d, MinDriftMargin)
		}
		c.DriftMargin = d
		return nil
	}
}

// WithLogger sets where the Locker logs its events (no URL form): a
// keep-alive that failed and is retried, a lease at risk and cleared, a
// lock lost and why. Nil, the default, logs nothing (the etcd client's own
// logs stay off). Keys are shown as errors show them; passwords never.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { return backend.SetLogger(l)(&c.Settings) }
}
