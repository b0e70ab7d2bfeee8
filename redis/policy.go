package redis

import (
	"context"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/redis/internal/guard"
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
// the check off with WithAllowEviction. It wraps locker.ErrUnsafeConfig, and
// is the redlock package's ErrEvictionPolicy too (one check for both).
var ErrEvictionPolicy = guard.ErrEvictionPolicy

// checkPolicy makes sure the server that holds k does not evict keys: its
// maxmemory-policy must be noeviction (see guard.ReadPolicy for how it is
// read; when the server will not tell, the acquire goes ahead, as the
// package documentation says). On Cluster each master is checked, when a
// key on it is first acquired; a server found safe is checked again after
// guard.Recheck.
func (l *Locker) checkPolicy(ctx context.Context, k keys) error {
	if l.cfg.AllowEviction {
		return nil
	}
	// The common case needs no request, nor a goroutine for one.
	cc, cluster := l.client.(*goredis.ClusterClient)
	switch {
	case !cluster:
		if l.policies.Fresh("") {
			return nil
		}
	case l.policies.Any():
		// The slot map is loaded, so this is a lookup in memory.
		if m, err := cc.MasterForKey(ctx, k.lock); err == nil && l.policies.Fresh(m.Options().Addr) {
			return nil
		}
	}
	return l.readPolicy(ctx, k, cc, cluster)
}

// readPolicy is checkPolicy's request, in a function of its own so that
// the common case, which needs none, moves nothing to the heap for its
// closure (issue 32).
func (l *Locker) readPolicy(ctx context.Context, k keys, cc *goredis.ClusterClient, cluster bool) error {
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
			if l.policies.Fresh(addr) {
				return nil
			}
		}
		policy, err := guard.ReadPolicy(ctx, c)
		if err != nil {
			return err
		}
		if err := guard.PolicyError(policy, addr); err != nil {
			return err
		}
		l.policies.Store(addr) // noeviction, or nobody can tell
		return nil
	}, nil)
}
