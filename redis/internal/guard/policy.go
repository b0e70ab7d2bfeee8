// Package guard holds the checks of a Redis server's configuration that the
// redis and redlock packages share: its maxmemory-policy (a server that may
// evict keys drops held locks and fencing counters) and what the server says
// it is (one server listed twice as Redlock nodes). Both packages refuse a
// server that fails a check with the same errors, recheck a server found
// safe after the same interval, and are turned off by the same option.
package guard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
)

// ErrEvictionPolicy is the redis and redlock packages' ErrEvictionPolicy
// (see there): a server whose maxmemory-policy is not noeviction. It wraps
// locker.ErrUnsafeConfig.
var ErrEvictionPolicy error = unsafeError("locker: redis: the server's maxmemory-policy lets it evict locks")

// unsafeError is a sentinel that wraps locker.ErrUnsafeConfig and keeps a
// message of its own.
type unsafeError string

func (e unsafeError) Error() string { return string(e) }
func (unsafeError) Unwrap() error   { return locker.ErrUnsafeConfig }

// Recheck is how long a server found safe is trusted before an acquire
// checks it again: a later CONFIG SET, or a failover to a replica configured
// otherwise, is noticed within it. A server found unsafe is checked again by
// every acquire, so that fixing its configuration takes effect at once.
const Recheck = time.Minute

// Cache remembers which servers were found safe, and when.
type Cache struct {
	mu sync.Mutex
	ok map[string]time.Time // by a name the caller chooses: when last found safe
}

// NewCache returns an empty Cache.
func NewCache() *Cache { return &Cache{ok: map[string]time.Time{}} }

// Fresh reports whether name was found safe less than Recheck ago.
func (c *Cache) Fresh(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.ok[name]
	return ok && time.Since(at) < Recheck
}

// Any reports whether some server was ever found safe.
func (c *Cache) Any() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ok) > 0
}

// Store records name as found safe now.
func (c *Cache) Store(name string) {
	c.mu.Lock()
	c.ok[name] = time.Now()
	c.mu.Unlock()
}

// Forget drops what is known of name, so that its next use checks it.
func (c *Cache) Forget(name string) {
	c.mu.Lock()
	delete(c.ok, name)
	c.mu.Unlock()
}

// PolicyError returns an error wrapping ErrEvictionPolicy, naming policy and
// where (a server's name for messages, or ""), when policy lets the server
// evict keys; nil for noeviction and for "" (the server would not tell).
func PolicyError(policy, where string) error {
	if policy == "" || policy == "noeviction" {
		return nil
	}
	if where != "" {
		where = " on " + where
	}
	return fmt.Errorf("%w: maxmemory-policy is %q%s; set it to noeviction (CONFIG SET maxmemory-policy noeviction, and in redis.conf), or use a Redis of its own for locks", ErrEvictionPolicy, policy, where)
}

// ReadPolicy returns the server's maxmemory-policy, or "" when the server
// will not tell. It asks with CONFIG GET, else (the command renamed,
// disabled by a managed service or not allowed to the ACL user) with INFO
// memory; when neither answers it cannot tell. Other errors (a failed
// connection, LOADING) are returned: the acquire would fail the same way.
func ReadPolicy(ctx context.Context, c goredis.Cmdable) (string, error) {
	m, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	return policyFrom(ctx, c, m, err)
}

// policyFrom finishes ReadPolicy from the reply to CONFIG GET.
func policyFrom(ctx context.Context, c goredis.Cmdable, m map[string]string, err error) (string, error) {
	switch {
	case err == nil:
		if p := m["maxmemory-policy"]; p != "" {
			return p, nil
		}
	case !Refused(err):
		return "", err
	}
	info, err := c.Info(ctx, "memory").Result()
	switch {
	case err == nil:
		p, _ := infoField(info, "maxmemory_policy")
		return p, nil
	case Refused(err):
		return "", nil
	default:
		return "", err
	}
}

// infoField returns the value of field in an INFO reply.
func infoField(info, field string) (string, bool) {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v, true
		}
	}
	return "", false
}

// Refused reports whether err is the server refusing a command for good (it
// is renamed or disabled, or the ACL user may not run it), rather than a
// failed connection or a passing state of the server (LOADING, BUSY,
// MASTERDOWN, ...), which would fail the acquire as well.
func Refused(err error) bool {
	if !IsServerReply(err) {
		return false
	}
	for _, transient := range []string{"LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN", "MOVED", "ASK"} {
		if strings.HasPrefix(err.Error(), transient+" ") {
			return false
		}
	}
	return true
}

// IsServerReply reports whether err is an error reply of the server rather
// than a failure of the connection.
func IsServerReply(err error) bool {
	var re goredis.Error
	return errors.As(err, &re)
}
