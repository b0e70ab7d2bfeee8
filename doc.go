// Package locker is one API for distributed locks over many backends: Redis
// (single node, Sentinel, Cluster; package redis), Redlock across
// independent Redis nodes (redis/redlock), PostgreSQL advisory locks
// (postgres), ZooKeeper (zookeeper), etcd (etcd), a SQL lock table on
// PostgreSQL, MySQL/MariaDB or SQLite (sqltable), and an in-process backend
// (memlock). A deployment picks its backend by constructor or by URL with
// Open, and the code that takes locks does not change.
//
// # The contract
//
// A Locker hands out Handles. Every backend keeps the same rules, and the
// conformance package checks them on real servers:
//
//   - Mutual exclusion while no fault occurs: no two holders of one key at once,
//     across goroutines, Lockers and processes.
//   - Fencing: every Handle carries a Token that is strictly greater than the
//     token of every earlier holder of the same key, even after a holder crashed
//     and its lease expired.
//   - Ownership: Release acts only on the caller's own lock; it never removes a
//     lock that another holder has since acquired.
//   - Liveness: a holder that dies stops blocking others within its TTL (or
//     session timeout); a waiter wakes when the lock frees, by notification.
//   - Loss is reported: when a holder can no longer be sure it holds the lock,
//     Done is closed and Err wraps ErrLost, no later than the moment another
//     client could acquire it.
//   - Every blocking call honours its context; an abandoned wait leaves nothing
//     behind.
//   - Keys are any non-empty valid UTF-8 string without NUL, up to MaxKeyLen
//     bytes, encoded injectively by every backend.
//   - Locks are not reentrant.
//   - One TTL: WithTTL(d) is the longest a lock outlives a holder that went
//     silent, on every backend; every TTL in [MinTTL, MaxTTL] works
//     everywhere, DefaultTTL is the default everywhere, and Handle.TTL
//     reports the lease the backend gave (see MinTTL for the rule).
//   - Who holds a key: WithOwner(s) describes the holder ("host=web-3
//     pid=4182"), every backend stores it with the lock, and an Inspector
//     reports it in LockInfo.Owner; for operators, not an identity check.
//
// # Why fencing tokens
//
// A lock can expire under a holder that is paused (a GC pause, a slow
// network) and is then granted to someone else, while the first holder
// still believes it holds it. A lock alone therefore cannot protect data.
// Send Token with every write and let the resource reject stale ones:
//
//	UPDATE accounts SET balance = $2, fence = $3 WHERE id = $1 AND fence <= $3
//
// A write that updates no row came from a holder that has been superseded
// (the holder's own later writes, with the same token, still pass).
//
// # Backends and URLs
//
// Backends register URL schemes when imported, in the manner of database/sql
// drivers; Open fails with "locker: unknown scheme" for a backend that was
// not imported:
//
//	import _ "github.com/go-locker/locker/redis"
//	l, err := locker.Open(ctx, "redis://localhost:6379/0?ttl=10s")
//
// New abilities are offered through optional interfaces found by type
// assertion, so that third-party backends keep compiling.
package locker
