package zookeeper

import "time"

// A lock's lease is the timeout of the session that owns its node (see the
// package documentation), so the Locker keeps one session per lease in
// use. To bound their number, a TTL is rounded down to the nearest lease
// step, a value of leaseSteps: 1, 1.5, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20,
// 30, 40 and 50 seconds, the same in minutes, then 1, 1.5, 2, 3, 4, 5, 6,
// 8, 10, 12, 15 and 20 hours, and 24h (locker.MaxTTL): 43 steps, each at
// most a third below the next, with every round value a program is likely
// to ask for (1s, 2s, 5s, 10s, 15s, 30s, 1m, 5m, 1h, 24h, ...) a step of
// its own. Rounding down is what the TTL contract allows (locker.MinTTL): a
// shorter lease is safe for exclusion, and Handle.TTL reports it.
var leaseSteps = func() []time.Duration {
	var steps []time.Duration
	for _, unit := range []time.Duration{time.Second, time.Minute} {
		for _, m := range []float64{1, 1.5, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 30, 40, 50} {
			steps = append(steps, time.Duration(m*float64(unit)))
		}
	}
	for _, m := range []float64{1, 1.5, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 24} {
		steps = append(steps, time.Duration(m*float64(time.Hour)))
	}
	return steps
}()

// leaseStep returns ttl rounded down to a lease step; a ttl below the first
// step (none of the portable range is) as it is.
func leaseStep(ttl time.Duration) time.Duration {
	step := ttl
	for _, s := range leaseSteps {
		if s > ttl {
			break
		}
		step = s
	}
	return step
}

// TTL returns the lease of the lock: the timeout the server granted the
// session that owns the lock's node when the lock was taken (for New's
// own connection, the one declared with WithSessionTimeout and checked
// against the server), the longest the lock outlives a holder that went
// silent. It is the TTL asked (locker.WithTTL, else the Locker's default)
// rounded down to a lease step, or the server's minSessionTimeout or
// maxSessionTimeout where the TTL lies beyond them (see the package
// documentation).
func (h *Handle) TTL() time.Duration { return h.lease }
