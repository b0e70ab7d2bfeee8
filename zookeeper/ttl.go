package zookeeper

import "time"

// This file is a placeholder of the TTL contract (locker.MinTTL) for
// ZooKeeper: the change that sizes sessions from the TTLs asked replaces
// it.

// TTL returns the lease of the lock: the session timeout the server granted
// the session that owns the lock's node (see Locker.SessionTimeout), the
// longest the lock outlives a holder that went silent.
func (h *Handle) TTL() time.Duration { return h.l.SessionTimeout() }
