package postgres

import (
	"time"

	"github.com/go-locker/locker"
)

// This file is a placeholder of the TTL contract (locker.MinTTL) for
// PostgreSQL: the change that makes the TTL bound how long the server keeps
// a silent holder's session (and its lock) replaces it.

// leaseOf is the lease of a lock taken with options o: the TTL asked, else
// locker.DefaultTTL.
func leaseOf(o locker.Options) time.Duration {
	if o.TTL == 0 {
		return locker.DefaultTTL
	}
	return o.TTL
}

// TTL returns the lease of the lock: for now the TTL asked (or
// locker.DefaultTTL), which an advisory lock does not yet enforce: it lasts
// as long as its session (see the package documentation).
func (h *handle) TTL() time.Duration { return h.ttl }
