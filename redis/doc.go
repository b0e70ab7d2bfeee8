// Package redis is the Redis backend of locker: SET NX PX with a random
// owner token, Lua compare-and-delete release and compare-and-pexpire
// renewal, fencing tokens from a per-key counter, and waiters queued on the
// server in arrival order, each woken by Pub/Sub when its turn comes; and
// the same for semaphores and reader-writer locks (see "Lock families").
// It works with a single server, a Sentinel failover client and a
// Cluster client, all through go-redis v9 (github.com/redis/go-redis/v9).
//
//	l := redis.New(goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"}))
//	defer l.Close()
//	h, err := l.Acquire(ctx, "invoice/42")
//	...
//	defer h.Release(ctx)
//
// # What it promises
//
// While no fault occurs, at most one holder has a key. Every acquisition
// returns a fencing token (Handle.Token) larger than that of every earlier
// holder of the key, as long as the key's fence counter survives (see
// below). A held lock is renewed every TTL/3 by a watchdog; when renewal
// fails for long enough that the lease may have run out, the Handle reports
// the loss (Done is closed, Err wraps locker.ErrLost) before the server can
// give the key to anyone else. Release and renewal act only on the caller's
// own lock, never on another holder's. A crashed holder blocks others for at
// most its TTL.
//
// TTL: every TTL of locker's portable range [locker.MinTTL, locker.MaxTTL]
// (1s to 24h) works; without locker.WithTTL a lock has locker.DefaultTTL
// (30s), or the Locker's WithTTL. The lease is the TTL rounded down to a
// whole millisecond (PX's unit), which Handle.TTL reports. Inspect reports
// the remaining lease (PTTL) but not the full one (LockInfo.Lease is 0):
// the lock key keeps only its expiry. It also reports the holder's
// locker.WithOwner description (LockInfo.Owner), which the lock key's
// value carries after the owner token and a space, set by the same SET
// that takes the lock (the lock families' holders have none).
//
// Every call returns when its context ends, with an error wrapping
// ctx.Err(), also for a plain cancel() while a request is in flight, and
// Close ends every call in progress with locker.ErrClosed at once, whatever
// the client's ContextTimeoutEnabled and ReadTimeout (see "Failure modes").
//
// The server must not evict keys: Acquire and TryAcquire refuse a server
// whose maxmemory-policy is anything but noeviction, with an error wrapping
// ErrEvictionPolicy (see "Eviction" below).
//
// A lock alone does not make data safe: a holder can be paused (GC, swap, a
// stopped VM) past its lease and resume believing it still holds the lock.
// Pass Handle.Token to the resource you protect and have it reject writes
// that carry a token lower than one it has seen:
//
//	UPDATE invoices SET status = 'sent', fence = $token
//	 WHERE id = 42 AND fence <= $token
//
// # How it works
//
// A key k is stored under these names, which share one Cluster hash tag, so
// that the scripts, which touch several of them, run on one slot:
//
//	<prefix>{base64url(k)}:lock             owner token [+ " " + WithOwner's description], expires with the lease
//	<prefix>{base64url(k)}:fence            fencing counter, never expires (but see WithFenceExpiry)
//	<prefix>{base64url(k)}:released-by:<o>  a release by owner token o, for 15s (a key per release)
//	<prefix>{base64url(k)}:queue            sorted set: the waiters, by arrival
//	<prefix>{base64url(k)}:waiters          sorted set: the same waiters, by deadline (ms, server clock)
//	<prefix>{base64url(k)}:wake:<id>        Pub/Sub channel of the Locker with that id: "your turn"
//
// The base64url encoding (no padding) is injective and contains no braces
// or colons, so no user key, whatever bytes it holds ("{", "}", "/", "*",
// spaces, unicode), can share a name with another key or break the tag.
// The prefix defaults to "locker:" (WithPrefix).
//
// Acquire and TryAcquire run one script: if the lock is free it increments
// the fence counter and sets the lock with SET PX; otherwise TryAcquire
// fails, and Acquire's script puts it in the key's queue in the same round
// trip (see "Waiting"). Release deletes the lock and, in the same script,
// publishes the owner token of the first live waiter on that waiter's
// Locker's channel, so a handoff costs about two round trips (the release,
// the waiter's attempt). The release also records itself for 15s
// (:released-by: and its owner token, a string that expires), so that a
// retry of the same release by go-redis (after a reply lost to a connection
// reset or a read timeout) is told that it succeeded, not that the lock was
// lost, even when other holders took the key and released it in between.
// (Versions before December 2026 kept the key's latest 32 releases in a
// sorted set under :recent-releases, and before that the last release only,
// in a string under :released; the new names let old and new Lockers share
// a key during an upgrade. A key released very often now has a record key
// per release of the last 15s, about 190 bytes each on Redis 7.0: 28 MB
// at 10,000 releases a second, where the set took 1.3 KB a key.)
//
// # Waiting
//
// Waiters are served in the order they came, across Lockers and processes:
// an Acquire that finds the key held (or free but promised to a waiter that
// came earlier) joins the end of the key's queue, and a free key goes to an
// Acquire only when it is at the head. A release tells the head, and only
// it: one message per release, one attempt by the waiter it wakes, however
// many wait (no herd). Under contention an acquisition costs three requests:
// the attempt that queued, the one that took the lock when told, and the
// release. TryAcquire never queues, and takes a free key even when waiters
// are queued (it fails only when another client holds the key), so it can
// overtake them.
//
// A Locker listens on its own channel of the key (one shared Pub/Sub
// connection per Locker and master, multiplexing every key it waits on;
// sharded SSUBSCRIBE on Cluster) while one of its Acquires waits, and for
// 10s after the last one left, so that a key under steady contention costs
// no subscription per acquisition. An Acquire that had to subscribe tries
// once more once the subscription is confirmed, since its turn may have
// come in between.
//
// Each queue entry has a deadline on the server clock: a third of the
// waiter's TTL (at least 150ms) after its last attempt. A waiter tries
// again at least every third of that (and at most every retry interval,
// WithRetryInterval, default 3s), which keeps its entry and recovers a lost
// message; the head of the queue also tries when the holder's lease runs
// out, since a crashed holder sends nothing. The scripts drop entries past
// their deadline. So a waiter that crashes or is cut off leaves the queue
// within a third of its TTL and holds up the key, when its turn comes, for
// at most that plus the next waiter's recheck interval (about 13s with the
// default 30s TTL; under a second with a 2s TTL). An Acquire that ends
// without the lock (its context, Close, an error) leaves the queue at once,
// and passes its turn on if it had come. The queue's keys expire at most
// two entry lifetimes (two thirds of the longest TTL queued) after their
// last entry does.
//
// Lockers of versions before the queue (issue 10) still exclude Lockers of
// this one (the lock key is the same), but they neither queue nor listen on
// the per-Locker channels: mixed, the old ones overtake the queue and wake
// by their retry interval.
//
// A call waits for its request only as long as its context and the Locker
// allow: go-redis turns a context's deadline into a socket deadline (with
// ContextTimeoutEnabled), but nothing ends a socket read on a cancel() or a
// Close. So a request runs on the caller's goroutine with a socket deadline
// at most 150ms away, and moves to a goroutine of its own only if no reply
// came by then: a cancel or a Close takes effect within about 150ms while a
// prompt reply costs no hand-off between threads; a link that slow turns
// this off for 10s. The socket deadline is the context's on a client with
// ContextTimeoutEnabled (clients built from a URL have it), and a timeout
// of 150ms on a *goredis.Client without it (through a clone made by its
// WithTimeout when the Locker is made: it shares the client's pool, and the
// hooks added before then). A *goredis.ClusterClient
// without ContextTimeoutEnabled runs every request on a goroutine of its
// own, which costs tens of microseconds per request on a small, busy
// machine (BENCHMARKS.md): set it. A request the caller stopped waiting
// for finishes in the background, bounded by the client's ReadTimeout, the
// context's deadline (with ContextTimeoutEnabled), and 30s when the client
// has no ReadTimeout; whatever lock it may have taken is deleted once it
// ends. Renewals always run off the caller's goroutine.
//
// Loss is measured on the local monotonic clock: the lease counts from the
// moment the last successful acquire or renewal request was sent (the server
// set the expiry later than that), minus a drift margin (WithDriftMargin,
// default TTL/50 + 100ms, at most TTL/4) for clock-rate differences and
// stalls of the holder's process (CPU throttling, timer latency). A
// timer independent of the renewal requests fires at that moment, so a
// request hanging on a partitioned or paused server cannot delay the report.
// With WithoutWatchdog the lease is not renewed and the Handle reports the
// loss a drift margin before the TTL runs out.
//
// Renewals go out in batches: a renewal that comes due waits
// up to 50ms (at most TTL/60) for the Locker's other renewals of its TTL
// that come due meanwhile, and one script renews them all (at most 256
// keys; on a Cluster, the keys of one hash slot, and likewise once a
// server in cluster mode behind a plain client refused keys of several
// slots), each key checked against its own owner, with its own verdict (a
// key written over with another type fails only its own). The lease still counts from the moment the
// renewal came due, before the batch left. The members of a batch come due
// together again a third of the TTL later, so a Locker holding 10,000 locks
// sends a few dozen renewal requests per interval instead of 10,000
// (TestRenewalsBatched; BENCHMARKS.md). A batch carries mutexes and the
// families' holders alike.
//
// # Lock families
//
// Besides the mutex, the Locker has counting semaphores and reader-writer
// locks (locker.Semaphorer, locker.ReadWriter; locker.Semaphore,
// locker.ReadLock and locker.WriteLock make them Lockers):
//
//	render := locker.Semaphore(l, 3) // at most 3 renders at once
//	h, err := render.Acquire(ctx, "render-farm")
//	...
//	r, err := l.AcquireRead(ctx, "config")  // many readers at once
//	w, err := l.AcquireWrite(ctx, "config") // or one writer
//
// Each permit, read lock and write lock is a Handle like the mutex's: a
// fencing token, a lease renewed by the watchdog (TTL, WithTTL), Done and
// Err on loss, the same Release verdicts, released by Close. Each family
// has a keyspace of its own: the mutex "k", the semaphore "k" and the
// reader-writer lock "k" are three locks that never wait for each other.
//
// Algorithm. A family's key k lives under the mutex's hash tag (one Cluster
// slot), with ":sem:" or ":rw:" before each name, so no two (family, key)
// pairs share a name:
//
//	<prefix>{base64url(k)}:sem:holders          hash: owner token → fencing token
//	<prefix>{base64url(k)}:sem:leases           sorted set: owners by lease deadline (ms, server clock)
//	<prefix>{base64url(k)}:sem:fence            the family's fence counter of k, never expires
//	<prefix>{base64url(k)}:sem:limit            the semaphore's n, while k has holders or waiters
//	<prefix>{base64url(k)}:sem:queue, :waiters  the waiters, as the mutex's
//	<prefix>{base64url(k)}:sem:released-by:<o>  a release, as the mutex's
//	<prefix>{base64url(k)}:sem:wake:<id>        Pub/Sub channel of the Locker with that id
//
// (":rw:" likewise; its limit is never written). Every step is one Lua
// script: acquire, release, leave (a waiter giving up), renew. Each first
// drops the holders whose lease deadline has passed and the queue entries
// past theirs. A holder's owner token starts with its kind ('p' permit,
// 'r' reader, 'w' writer). Admission is first come, first served: a
// semaphore admits a waiter while holders + waiters ahead of it < n; a
// reader, while no writer holds the key or waits ahead of it; a writer,
// when nobody holds the key or waits ahead of it. An Acquire that does not
// fit joins the queue in the same script, as the mutex's does, and waits
// for a wake-up (recheck timers as for the mutex, see "Waiting"). A
// TryAcquire counts the whole queue as ahead of it: unlike the mutex's, it
// never overtakes a waiter, so a TryAcquireRead fails while a writer
// waits.
//
// Notification. Every script that changes what the key admits (a release,
// a leave, an admission, the drop of a dead lease or entry) computes the
// waiters admissible before and after it and publishes, on each new one's
// Locker's channel, that waiter's owner token: a freed permit wakes one
// waiter, a writer's release wakes the readers queued behind it up to the
// next writer (admitted together), a reader's release wakes nobody until
// the last one wakes the writer. No herd: a waiter that is not admitted is
// never told anything.
//
// Tokens come from the family's fence counter of the key (INCR, or the
// clock floor of WithClockTokens, with WithFenceExpiry and WithTokenBase as
// for the mutex): every permit's token is above every earlier permit's of
// the key; readers and writers of a key share one counter, so a writer's
// token is above every earlier reader's and writer's, and a reader's above
// every earlier writer's. The token of each holder is kept in the holders
// hash, so a request the client retries after a lost reply gets its first
// grant back, not a second one.
//
// A semaphore's n is fixed while the key has holders or waiters: an
// acquisition with another n fails at once with an error wrapping
// locker.ErrLimitMismatch (a waiting Acquire too). Once the holders and
// waiters are gone (released, or their leases run out) another n is taken.
//
// Failure modes (beyond the mutex's, which all apply):
//   - Holder crashes: its lease deadline passes and the next script drops
//     it; the waiter that one departure would admit retries when the first
//     lease runs out (it learns the deadline from its last attempt), so the
//     permit comes back within the TTL (plus a recheck interval when other
//     holders' leases run out first).
//   - Holder cut off: its renewals fail and its Handle reports ErrLost a
//     drift margin before its deadline on the server, before anyone else
//     can be admitted in its place.
//   - A holder's record removed on the server (an operator, a failover to a
//     replica that missed it): its next renewal finds it gone and the
//     Handle reports ErrLost; its Release reports ErrLost and touches no
//     other holder.
//   - Waiter crashes or is cut off: its entry lapses at its deadline (a
//     third of its TTL) and the next script that runs drops it and wakes
//     whom that admits; a dead writer in the queue holds the readers behind
//     it up for at most that plus their recheck interval.
//   - Failover or restart without persistence loses holders, queue and
//     counter as it does the mutex's lock (see "Fencing tokens and
//     persistence").
//
// Cost: an uncontended acquisition or release is one script call, as the
// mutex's, each running about a dozen commands on the server (against the
// mutex's three to acquire and four to release); under contention a
// handoff costs two (the release, the woken waiter's attempt).
//
// # URL
//
// Opening by URL (locker.Open) needs this package imported. Forms:
//
//	redis://[user:password@]host:port[/db][?options]
//	rediss://...                          TLS
//	redis+cluster://[user:password@]host:port?addr=host2:port&addr=host3:port[&options]
//	rediss+cluster://...                  Cluster over TLS
//	redis+sentinel://[user:password@]sentinel:port[/db]?master_name=mymaster&addr=sentinel2:port[&options]
//
// Options of the Locker: the parameters every backend shares (see
// backend.Settings), ttl (WithDefaultTTL, a Go duration such as 30s),
// drift_margin (WithDriftMargin), prefix (WithPrefix), retry_interval
// (WithRetryInterval), watchdog=false (WithoutWatchdog), token_base
// (WithTokenBase) and ddl (no effect: Redis has no schema); and this package's own clock_tokens (true/false),
// fence_expiry (a duration; needs clock_tokens=true), allow_eviction
// (true/false), replica_ack (WithReplicaAck's n, 0 off) and
// replica_ack_timeout (a duration, default 1s; needs replica_ack).
// Every other parameter is handed to go-redis' own URL parsers (its ParseURL,
// ParseClusterURL and ParseFailoverURL: dial_timeout, read_timeout,
// pool_size, client_name, skip_verify, ...), which reject what they do not
// know; so is every malformed value, with an error wrapping
// locker.ErrInvalidURL that never contains the password. Clients opened from
// a URL have ContextTimeoutEnabled set (unless context_timeout_enabled says
// otherwise), and the Locker closes them in Close. For redis+sentinel the
// user and password of the URL log in to the Sentinels; the master's own go
// in the username and password parameters (go-redis' convention). A CA for
// rediss cannot travel in a URL: use skip_verify=true only on trusted
// networks, or build the client with a tls.Config and call New.
//
// # Least privilege
//
// A Locker needs exactly this ACL rule on one node or behind Sentinel
// (here for the prefix app:, WithPrefix or the URL parameter prefix; the
// default prefix is locker:): its keys and Pub/Sub channels all begin with
// the prefix, and the commands are those its Lua scripts call, the
// scripts' own (EVALSHA, and EVAL after a NOSCRIPT or in a pipeline), the
// waits' (SUBSCRIBE, UNSUBSCRIBE, PING), the connection's (HELLO) and the
// eviction check's (INFO):
//
//	ACL SETUSER app on >password resetkeys ~app:* resetchannels &app:* -@all +evalsha +eval +get +set +incr +pttl +del +exists +pexpire +time +zadd +zrem +zrange +zrangebyscore +zremrangebyscore +zscore +zrank +zcard +hget +hset +hdel +publish +subscribe +unsubscribe +ping +hello +info
//
// The integration tests run the conformance suite as a user with this
// rule, as written here. A user without one of these rights gets the
// server's NOPERM error, naming the command, at the first call that needs
// it (the scripts' commands at the first acquire), never ErrNotAcquired.
// Without +info the eviction check cannot read the policy (CONFIG GET,
// which it tries first, also shows secrets such as requirepass, so the
// rule leaves it out) and takes locks without knowing (see "Eviction").
// On Cluster, add +spublish +ssubscribe +sunsubscribe for the sharded
// Pub/Sub and what go-redis' ClusterClient reads the slots with
// (+cluster|slots, +cluster|shards); the tests do not cover that variant.
// With WithReplicaAck (replica_ack=), add +wait.
//
// # Eviction
//
// With a maxmemory-policy other than noeviction, a Redis that reaches
// maxmemory deletes keys to make room: the volatile-* policies keys with an
// expiry, which every held lock has, and the allkeys-* policies any key,
// fence counters included. An evicted lock is free for another client at
// once while its holder hears nothing until its next renewal, up to TTL/3
// later; an evicted counter starts again at 1, so tokens go backwards. So
// the Locker requires noeviction (with which a full Redis refuses new locks
// with an OOM error instead of dropping held ones; an Acquire of a held key
// fails the same way, as joining the queue needs memory): before its first acquire
// on a server, and again a minute after the last check, it reads the policy
// with CONFIG GET maxmemory-policy, or INFO memory where CONFIG is renamed,
// disabled (as on several managed services) or not allowed to the ACL user,
// and refuses with an error wrapping ErrEvictionPolicy that names the
// policy. On Cluster it checks each master. When neither command answers it
// cannot tell and goes ahead. A policy changed after a check is noticed
// within a minute. WithAllowEviction (URL: allow_eviction=true) turns the
// check off, for a Redis shared with a cache whose policy cannot change, at
// the price above; use WithClockTokens with it.
//
// # Failure modes
//
//   - Holder crashes: the lock expires after its TTL; the next holder gets a
//     larger token.
//   - Holder cut off from Redis, or Redis paused: renewals fail, and the
//     holder's Handle reports ErrLost a drift margin before the lease ends
//     on the server. Other clients get the key after the TTL.
//   - Holder paused past its lease (GC, a stopped VM): its writes carry the
//     old token, which a fenced resource rejects. A Release it makes on
//     resuming, before the loss timer has fired, reports ErrLost if the
//     lease had run out and the release request fails; a release that
//     finds the lock gone reports ErrLost too.
//   - Server restarts: without persistence the lock and the fence counter
//     are gone. Another client can take the key at once, before the holder's
//     next renewal finds the lock missing and reports ErrLost, and tokens
//     start again from 1 unless WithClockTokens is on (see below). Restart
//     a server that held locks only after the longest TTL has passed, or
//     persist: with AOF or a snapshot the lock and counter come back with the
//     server, as durable as the fsync or snapshot policy.
//   - Failover (Sentinel, Cluster): replication is asynchronous, so a lock
//     or counter increment not yet copied to the replica that is promoted is
//     lost: two clients may hold the key, and tokens may repeat. Fencing on
//     the resource side catches writes only if tokens never go backwards.
//     WithReplicaAck (replica_ack=n) narrows the window: an acquisition or
//     renewal counts only once WAIT n confirms that n replicas have it, so
//     Sentinel promoting a replica that confirmed keeps the lock and the
//     counter; an acquisition not confirmed in time is given back and
//     fails (ErrNotReplicated), a renewal not confirmed is retried (the
//     lock at risk). In 20 scripted failovers each way with a replica
//     stalled behind a write backlog and the master killed right after
//     the acquisition (CHAOS.md, "Redis failover"), every run without it
//     ended with two holders and a repeated token, and none with it. It
//     cannot close: the promotion of a replica that had not confirmed (n
//     below the number of replicas that may be promoted, or Sentinel
//     choosing a lagging one), the loss of a write that reached the
//     replicas' memory only (WAIT is no fsync; WAITAOF, Redis 7.2, is not
//     used), and a refused acquisition's writes that did reach a replica
//     (its counter increment is harmless, its lock was deleted on the
//     master by the give-back, which may itself be lost to a failover: the
//     key then stays taken until its lease ends). Not on Cluster.
//   - Lost Pub/Sub messages: the Locker checks its Pub/Sub connections (a
//     PING after 3s of silence) and replaces a failed one, subscribing again
//     channel by channel and waking every waiter once, since its turn may
//     have come meanwhile. When a key's slot moves to another Cluster master
//     (resharding), the old master drops the subscriptions of the slot and
//     says so; the waiters are woken once and subscribe on the new master.
//     A message lost otherwise (a failover) costs the waiter whose turn it
//     was at most its recheck interval (see "Waiting").
//   - Waiter crashes or is cut off: its queue entry is dropped at its
//     deadline; the key waits for it at most the bound given in "Waiting".
//   - Failover loses the queue like any other write not yet replicated:
//     waiters then re-enter it in the order of their next attempts, within
//     their recheck interval.
//   - A request in flight on a dead connection (a partition, a paused
//     server): the call returns when its context ends (within
//     milliseconds, also on a plain cancel()) or when the Locker closes
//     (ErrClosed). Close waits at most 250ms for requests in flight. One
//     stuck on a dead connection finishes in the background when the
//     client is closed (a Locker from Open closes its own in Close), at
//     its socket deadline (the client's ReadTimeout, and with
//     ContextTimeoutEnabled also the caller's deadline, or 30s on a client
//     without ReadTimeout); its goroutine may outlive Close until then.
//
// # Fencing tokens and persistence
//
// Tokens come from INCR on the fence counter, which never expires. They
// increase as long as the counter survives. It does not survive a restart
// without persistence, FLUSHDB/FLUSHALL, eviction (which the Locker refuses,
// see "Eviction", unless WithAllowEviction), or a failover to a replica
// that had not received the latest increments. For tokens you can rely on:
// run with appendonly yes and appendfsync always (everysec can lose the last
// second of increments on a crash), keep maxmemory-policy noeviction, and
// under replication make failover wait for replicas (min-replicas-to-write,
// or WithReplicaAck, which narrows but does not close the window: see
// "Failure modes").
//
// Because counters never expire, Redis keeps one small key (about 100 bytes)
// for every distinct key ever locked. Locks on a bounded set of names cost
// nothing more; a program that locks ever new names (one per order, per
// request) grows Redis' memory without end. WithFenceExpiry (URL:
// fence_expiry) lets a counter expire after the key has not been acquired
// for a while; it needs WithClockTokens, since only the clock floor keeps
// tokens increasing once a counter is gone.
//
// WithClockTokens (URL: clock_tokens=true) removes most of that dependence:
// each token becomes max(previous + 1, the server's clock in microseconds),
// so a lost counter restarts above every earlier token unless the clock of
// the server issuing the next token is behind the one that issued the last.
// It does not bring back a lost lock: after a restart without persistence or
// a failover, another client may hold the key while the old holder has not
// yet noticed, and only fencing on the resource side stops the old holder's
// writes. Where tokens must never regress whatever happens to Redis and its
// clocks, take locks from a consensus store (etcd, ZooKeeper) instead.
//
// WithTokenBase(n) (token_base=n) adds n to every token the Locker hands
// out and Inspect reports; the counter itself is unchanged (see
// locker.MaxTokenBase). A counter grows by one per acquisition of its key
// from 1, or with WithClockTokens stays near the server's clock in
// microseconds (about 1.8e15), so it stays far below 2^62, and n + token,
// with n at most 2^62, fits an int64. A counter beyond that (written by
// hand) makes the acquisition fail with an error naming token_base, the
// lock given back.
//
// The tests against real servers (conformance, faults, Cluster, Sentinel, TLS,
// ACL, benchmarks) live in the integration module, integration/redis; they
// run against Redis 7.0. The scripts use nothing newer than Redis
// 5; on Cluster the wake-ups use sharded Pub/Sub, new in Redis 7 (with an
// older Cluster, locks work but waiters wake only by their timers).
//
// *goredis.Ring is not supported: it moves keys to another shard when one
// fails, which would let two clients hold one lock.
//
// # At risk and logging
//
// A Handle is a locker.AtRisker: at risk from a renewal that failed, or has
// not answered within its retry interval (a twentieth of the TTL: a
// partition holds the request), until one succeeds. WithLogger logs the
// renewal failures, the lock at risk and cleared, its loss and why, a
// Pub/Sub connection replaced and a Cluster slot moved; nothing without it.
package redis
