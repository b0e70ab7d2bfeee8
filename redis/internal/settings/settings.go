// Package settings is what the redis and redlock packages configure alike:
// the settings both Lockers have (backend.Settings, which every backend
// shares, and the eviction-policy opt-out), their checks, and the parts of
// their URLs that both read the same way. Each package keeps its own exported
// Option type and With functions (their docs say what the setting means
// for that backend); their bodies are one line over this.
package settings

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/lease"
)

// Core holds the settings both Lockers have: the shared ones
// (backend.Settings: the default TTL, drift margin, prefix, retry interval,
// watchdog) and the eviction-policy opt-out. A package's config embeds it.
type Core struct {
	backend.Settings
	Limits        lease.Limits // the package's bounds on a lease; names it in errors
	AllowEviction bool         // skip the maxmemory-policy check
}

// Set applies a shared setting, naming the backend in its error.
func (c *Core) Set(s backend.Setting) error {
	if err := s(&c.Settings); err != nil {
		return fmt.Errorf("%s: %w", c.Limits.Backend, err)
	}
	return nil
}

// Check reports a default TTL outside the limits.
func (c *Core) Check() error { return c.Limits.Check(c.TTL) }

// DriftFor returns the drift margin of a lock of ttl, or an error when the
// configured one leaves too little of the lease (see lease.Limits.Drift).
func (c *Core) DriftFor(ttl time.Duration) (time.Duration, error) {
	return c.Limits.Drift("drift margin", c.DriftMargin, ttl)
}

// LockTTL resolves the lease of one call from its options: the TTL asked
// (or the default) rounded down to a whole millisecond, Redis' unit for
// PX and PEXPIRE, the nearest safe lease by locker's TTL rule. It is the
// lease the handle reports and times its renewals and loss by.
func (c *Core) LockTTL(opts []locker.Option) (time.Duration, error) {
	ttl, err := c.Limits.TTL(c.TTL, opts)
	return ttl.Truncate(time.Millisecond), err
}

// Apply applies opts to cfg (backend.Apply: every error, joined).
func Apply[C any, O ~func(*C) error](cfg *C, opts []O) error { return backend.Apply(cfg, opts) }

// ContextTimeoutOption is the go-redis URL parameter that both packages
// default to true (see DefaultContextTimeout).
const ContextTimeoutOption = "context_timeout_enabled"

// DefaultContextTimeout turns a client's ContextTimeoutEnabled (enabled)
// on unless the URL's go-redis parameters (rest) set it: a request's
// deadline then reaches the socket.
func DefaultContextTimeout(enabled *bool, rest url.Values) {
	if !rest.Has(ContextTimeoutOption) {
		*enabled = true
	}
}

// ClientURLError wraps an error of go-redis' URL parsers, with every
// secret of the URL u blanked out in case the parser quoted it.
func ClientURLError(scheme string, u *url.URL, err error) error {
	// go-redis prefixes its own errors with "redis: "; the scheme says it.
	msg := strings.TrimPrefix(backend.Redact(err.Error(), u), "redis: ")
	return fmt.Errorf("%w: %s: %s", locker.ErrInvalidURL, scheme, msg)
}
