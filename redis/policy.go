package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// ErrEvictionPolicy reports a Redis server whose maxmemory-policy is not
// noeviction. Every other policy lets Redis delete keys when it reaches
// maxmemory: the volatile-* policies delete keys that carry an expiry, as
// every held lock does, and the allkeys-* policies any key, the fence
// counters included. An evicted lock is free at once for another client
// while its holder hears nothing until its next renewal; an evicted counter
// starts again at 1, so tokens go backwards. Acquire and TryAcquire refuse
// to take locks on such a server with an error wrapping ErrEvictionPolicy
// that names the policy. Set maxmemory-policy noeviction on the server (with
// it, a full Redis refuses new locks with an OOM error instead of dropping
// held ones), give locks a Redis of their own, or, knowing the cost, turn
// the check off with WithAllowEviction.
var ErrEvictionPolicy = errors.New("locker: redis: the server's maxmemory-policy lets it evict locks")

// policyRecheck is how long a server found safe is trusted before an
// acquire checks it again: a later CONFIG SET, or a failover to a replica
// configured otherwise, is noticed within it. A server found unsafe is
// checked again by every acquire, so that fixing its configuration takes
// effect at once.
const policyRecheck = time.Minute

// policyCache remembers which servers were found not to evict keys.
type policyCache struct {
	mu sync.Mutex
	ok map[string]time.Time // by master address, "" for a client of one master: when last found safe
}

func (c *policyCache) fresh(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.ok[addr]
	return ok && time.Since(at) < policyRecheck
}

// any reports whether some server was found safe (on Cluster: the client
// has loaded its slot map since, as it never unloads it).
func (c *policyCache) any() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ok) > 0
}

func (c *policyCache) store(addr string) {
	c.mu.Lock()
	c.ok[addr] = time.Now()
	c.mu.Unlock()
}

// checkPolicy makes sure the server that holds k does not evict keys: its
// maxmemory-policy must be noeviction. It asks with CONFIG GET, else (the
// command renamed, disabled by a managed service or not allowed to the ACL
// user) with INFO memory; when neither answers it cannot tell and lets the
// acquire go ahead (the package documentation says so). On Cluster each
// master is checked, when a key on it is first acquired.
func (l *Locker) checkPolicy(ctx context.Context, k keys) error {
	if l.cfg.allowEviction {
		return nil
	}
	// The common case needs no request, nor a goroutine for one.
	cc, cluster := l.client.(*goredis.ClusterClient)
	switch {
	case !cluster:
		if l.policies.fresh("") {
			return nil
		}
	case l.policies.any():
		// The slot map is loaded, so this is a lookup in memory.
		if m, err := cc.MasterForKey(ctx, k.lock); err == nil && l.policies.fresh(m.Options().Addr) {
			return nil
		}
	}
	return l.exec(ctx, func(ctx context.Context) error {
		var (
			c    goredis.Cmdable = l.via(ctx)
			addr string
		)
		if cluster {
			m, err := cc.MasterForKey(ctx, k.lock)
			if err != nil {
				return err
			}
			c, addr = m, m.Options().Addr
			if l.policies.fresh(addr) {
				return nil
			}
		}
		policy, err := readPolicy(ctx, c)
		if err != nil {
			return err
		}
		if policy != "" && policy != "noeviction" {
			where := ""
			if addr != "" {
				where = " on " + addr
			}
			return fmt.Errorf("%w: maxmemory-policy is %q%s; set it to noeviction (CONFIG SET maxmemory-policy noeviction, and in redis.conf), or use a Redis of its own for locks", ErrEvictionPolicy, policy, where)
		}
		l.policies.store(addr) // noeviction, or nobody can tell
		return nil
	}, nil)
}

// readPolicy returns the server's maxmemory-policy, or "" when the server
// will not tell: a refusal of both commands, or no such field.
func readPolicy(ctx context.Context, c goredis.Cmdable) (string, error) {
	m, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	switch {
	case err == nil:
		if p := m["maxmemory-policy"]; p != "" {
			return p, nil
		}
	case !refused(err):
		return "", err // the acquire would fail the same way
	}
	info, err := c.Info(ctx, "memory").Result()
	switch {
	case err == nil:
		for _, line := range strings.Split(info, "\n") {
			if p, ok := strings.CutPrefix(strings.TrimSpace(line), "maxmemory_policy:"); ok {
				return p, nil
			}
		}
		return "", nil
	case refused(err):
		return "", nil
	default:
		return "", err
	}
}

// refused reports whether err is the server refusing a command for good (it
// is renamed or disabled, or the ACL user may not run it), rather than a
// failed connection or a passing state of the server (LOADING, BUSY,
// MASTERDOWN, ...), which would fail the acquire as well.
func refused(err error) bool {
	if !isServerReply(err) {
		return false
	}
	for _, transient := range []string{"LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN", "MOVED", "ASK"} {
		if strings.HasPrefix(err.Error(), transient+" ") {
			return false
		}
	}
	return true
}
