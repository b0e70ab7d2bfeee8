// Package redlock is the Redlock backend of locker: one lock over N
// independent Redis nodes (N ≥ 3, odd), held while a majority of them hold
// it, with fencing tokens that increase per key — which no other Redlock
// implementation we know of provides (redsync, RedLock.net, DistributedLock,
// Redisson's RedissonRedLock hand out none, or none that is ordered).
//
//	l := redlock.New([]*goredis.Client{c1, c2, c3})
//	if err := l.Err(); err != nil { ... }   // wrong clients or options
//	defer l.Close()
//	h, err := l.Acquire(ctx, "invoice/42")
//	...
//	defer h.Release(ctx)
//
// # When it is worth it
//
// Redlock buys availability, not correctness. One Redis node (the redis
// package, perhaps with Sentinel) is the right lock for efficiency: a
// duplicate cron run or a second worker now and then costs little, and one
// node is faster and simpler. Redlock keeps the lock service up while a
// minority of its nodes is down, without the failover window in which a
// Sentinel-promoted replica that missed the last write grants a held lock
// again. Its safety rests on timing assumptions (bounded clock drift between
// the nodes and the client, bounded network delay and process pauses): a
// holder paused past its lease (GC, a stopped VM) resumes believing it holds
// the lock. So where correctness matters, use the fencing token: pass
// Handle.Token to the resource and have it reject writes with a token lower
// than one it has seen. When even that is not enough — no resource that can
// check a token — use a consensus system (etcd, ZooKeeper).
//
// # TTL
//
// Every TTL of locker's portable range [locker.MinTTL, locker.MaxTTL] (1s
// to 24h) works; without locker.WithTTL a lock has locker.DefaultTTL (30s),
// or the Locker's WithTTL. The lease set on each node is the TTL rounded
// down to a whole millisecond (PX's unit), which Handle.TTL reports.
// Inspect reports the remaining lease but not the full one (LockInfo.Lease
// is 0): the nodes keep only the expiry.
//
// # The algorithm
//
// Acquire (one round): a fresh random owner token; SET lock owner NX PX ttl
// on every node in parallel, each request bounded by the node timeout
// (WithNodeTimeout, default TTL/10 within [50ms, 3s]; the first request of
// a Locker to each node gets up to 1s more for dialling); a node that
// grants also increments its own counter for the key (INCR, in the same
// script) and returns it. The round waits for every node's answer (or
// timeout) unless a majority has already refused. It succeeds iff
//
//   - at least N/2+1 nodes granted,
//   - the fencing write-back (below) confirmed the lock on at least N/2+1
//     of them, and
//   - the validity TTL − elapsed − drift, measured on the client's monotonic
//     clock from the moment the round's requests left, is at least a tenth of
//     the TTL.
//
// Otherwise the lock is deleted (owner-checked) on every node that may hold
// it — those that granted and those whose reply was lost — before the round
// returns; a grant that arrives after the round stopped waiting for it is
// deleted when it arrives. TryAcquire makes one round; Acquire retries (see
// Waiting) and gives up with ErrNoQuorum when, three rounds in a row, so
// many nodes failed that no majority could answer.
//
// The drift allowance (WithDriftMargin, URL drift_margin) defaults to TTL/50 + 100ms, at most
// TTL/4: 2% for the nodes' clocks running faster than the client's (Redis
// expires keys by its own clock) and 100ms for timer latency and stalls of
// the holder on a loaded machine. The Redlock description suggests 1% plus
// a few milliseconds; a larger allowance only makes the holder give the
// lock up sooner.
//
// Renewal: every TTL/3 an owner-checked PEXPIRE on every node in parallel;
// the round ends as soon as a majority has answered either way. A renewal
// round sent at t that a majority confirmed moves the validity to
// t + TTL − drift. When a majority answers that the lock is no longer
// theirs, the lock is lost at once; when nodes fail, the round is retried
// until the validity ends, and the holder is told of the loss (Done closes,
// Err wraps locker.ErrLost) at the validity's end by the client's monotonic
// clock, even while requests hang — before a majority of the nodes can have
// expired the lock, if the drift allowance holds.
//
// Release: owner-checked DEL on every node in parallel (each bounded by the
// node timeout), which publishes on the key's channel on every node where it
// deleted. It succeeds when a majority deleted; when nodes failed it gives
// the lock up all the same and says on how many nodes it remains until its
// TTL ends; when every node answered and fewer than a majority held it, the
// error wraps locker.ErrLost. Each node remembers the key's latest 32
// releases for 15 seconds after the last (their owner tokens, in a sorted
// set under the key's ":recent-releases" name), so that a release whose
// reply was lost and which go-redis sends again is counted as done, not as
// a lock that had expired, even when other holders came and went
// meanwhile. The clean-up of a failed round is remembered the same way,
// and an acquire request of that round that reaches a node after it (one
// that waited on another connection, or in the network) is refused there
// instead of leaving a lock nobody holds until its lease ends.
//
// # Fencing tokens
//
// Each node j keeps a counter c_j per key, changed only by a grant (INCR)
// and by the write-back (c_j := max(c_j, T)), so it never decreases. A
// round of holder A that got grants from the set G_A (a majority) takes the
// candidate T_A = max of the values v_A(j) the nodes of G_A returned, then
// runs the write-back on G_A: on each node, if A's lock is still there,
// c_j := max(c_j, T_A). Let W_A ⊆ G_A be the nodes where it confirmed; the
// lock counts as acquired only if W_A is a majority.
//
// Claim: for two acquisitions A and B that both succeeded, if A's lock came
// first on any node of W_A ∩ W_B then T_B > T_A. In particular a holder that
// acquires after an earlier holder's acquisition completed (its lease ran
// out, it was paused, it crashed, it released) gets a larger token.
//
// Proof. W_A and W_B are majorities of the same N nodes, so they share a
// node j. On j, A's lock was present from the grant whose value A used until
// at least A's write-back (the write-back checked it; A's owner token is
// fresh for the round, and no request of A that could set it again is in
// flight after A read the grant's reply); likewise for B. Two locks are
// never present on one node at once (SET NX), so one of these intervals
// ends before the other begins. If A's comes first, B's grant on j ran
// after A's write-back on j, so c_j ≥ T_A then and the grant's INCR
// returned v_B(j) ≥ T_A + 1, hence T_B ≥ v_B(j) > T_A. If B's came first,
// T_A > T_B by the same argument, so the order on every common node is the
// same. An acquisition B that began after A completed has its grant on j
// after A's write-back, so A's interval came first on j. ∎
//
// The argument needs no clock: leases that expire early on some nodes, a
// clock that jumps, a holder paused for minutes, or deleted lock keys
// change which acquisitions succeed, never the order of their tokens. A
// retried acquire request (go-redis retries one whose reply was lost) that
// finds our lock returns the node's counter, which is at least its grant's
// value; one that finds it gone grants again, and its reply is the one
// used. The cost is the write-back round: one more round trip per
// acquisition (see BENCHMARKS.md).
//
// What breaks it: a node that loses its counter — a restart without
// persistence, FLUSHALL, eviction of the counter key, a failover to a
// replica that missed the latest writes. Its counter starts again from
// zero, and if it is the only node the next majority shares with the last
// write-back majority, the next token can be lower than the last. Run every
// node with appendonly yes and appendfsync always (the counter is then on
// disk before the node replies) and maxmemory-policy noeviction, and never
// delete the ":fence" keys. A restart delay longer than the largest TTL (the
// Redlock description's advice for nodes without fsync) restores mutual
// exclusion, since no lock the restarted node forgot can still be live, but
// not fencing: the counter is still gone. The fault tests in
// integration/redlock show both: tokens stay ordered when a lock key
// disappears early on one node, and go back after a node forgot its keys
// (a restart without persistence, simulated by deleting them).
//
// WithTokenBase(n) (token_base=n) adds n to every token the Locker hands
// out and Inspect reports; the counters and the write-back keep the nodes'
// own values (see locker.MaxTokenBase). A counter grows by one per grant
// of its key from 1, so it stays far below 2^62, and n + token, with n at
// most 2^62, fits an int64; a counter beyond that (written by hand) makes
// the acquisition fail with an error naming token_base, the lock given
// back.
//
// # Unsafe configurations
//
// Two configurations would break the lock, and are refused:
//
//   - A node whose maxmemory-policy is not noeviction: it may evict held
//     locks and, under an allkeys-* policy, the fencing counters, after which
//     tokens go backwards (on unchecked nodes with cache traffic: the last
//     holder's token 5, the next one's 1). Acquire and TryAcquire fail with
//     an error wrapping ErrEvictionPolicy (the redis package's, from one
//     shared check) that names the node and its policy, while any node has
//     such a policy; fixing the policy takes effect at the next acquire.
//     WithAllowEviction (URL: allow_eviction=true) turns the check off.
//   - One server under two names (127.0.0.1:6379 and localhost:6379, a proxy
//     and the server behind it, two database numbers of one server): a
//     majority of names is then not a majority of servers, and one live
//     server of three grants the lock. New refuses equal addresses; the
//     servers themselves tell the rest: every acquire fails, with an error
//     naming both nodes, once two nodes reported the same run_id (INFO
//     server) or, where INFO is not allowed to the user, the same identity
//     key (the prefix followed by "node-id", written once with SET NX).
//
// Both are checked at first contact, not by New (which does not contact the
// nodes, and some may be down then): each node is asked, in the pipeline of
// an acquire request, as soon as it answers for the first time, and again a
// minute after it last answered. A node counts towards a majority, in an
// acquisition or a renewal, only once its identity was compared with the
// others' read at the same time: a run_id changes when its server restarts,
// so a round that hears a node's first or a new run_id, and did not ask
// every node, asks the others as well (one more round trip, only then)
// before it counts any grant; a node that does not answer when every node
// is asked stops counting until it answers again (see vet.go). When the server tells neither its policy nor its identity (both
// commands refused), the Locker cannot check, and goes ahead.
//
// # Waiting
//
// An Acquire whose first round failed subscribes to the key's channel on
// every node (one Pub/Sub connection per node and Locker, shared by all its
// waiters), waits until a majority confirmed the subscription (at most the
// node timeout), and tries again. Then it sleeps until a release is
// announced on any node (the first message wakes it) or its back-off ends:
// at most the holder's remaining lease on the nodes that block a majority,
// at most the retry interval (WithRetryInterval, default 1s; the safety net
// for a lost message), and after a round that split the nodes between
// contenders a few milliseconds doubling, with jitter. There is no queue:
// the waiters woken by a release contend, and any of them may win. A round
// that fails deletes its partial grants without announcing them, so
// contenders do not wake each other while the holder holds.
//
// # Inspect
//
// Locker implements locker.Inspector: it reads the lock on every node and
// reports the key held when one owner has it on a majority, with the token
// its write-back recorded in the lock's value ("<owner>:<token>") and the
// time until it stops holding a majority unless renewed.
//
// # URL
//
//	redlock://[user:password@]host1:6379,host2:6379,host3:6379[/db][?ttl=30s&drift_margin=700ms&node_timeout=200ms&retry_interval=1s&prefix=locker:redlock:]
//	rediss+redlock://...    (TLS to every node)
//
// ttl, drift_margin, retry_interval, prefix and token_base are the
// parameters every backend shares (WithDefaultTTL, WithDriftMargin,
// WithRetryInterval, WithPrefix, WithTokenBase; see backend.Settings), ddl is accepted and has no effect,
// watchdog=false is refused (Redlock always renews); node_timeout and
// allow_eviction are this package's own,
// plus go-redis' client parameters (see Open), except skip_verify, which is
// refused (build the clients with a tls.Config and call New instead).
// Unknown parameters and malformed node addresses are rejected; the
// password appears in no error.
//
// # Failure modes
//
//   - A minority of nodes down, paused or cut off: acquisitions, renewals and
//     releases still succeed; each round to a node that does not answer
//     costs up to the node timeout.
//   - A majority down: TryAcquire fails with ErrNoQuorum after one round,
//     Acquire after three (the error says how many nodes granted, were held by
//     another client and failed); a held lock whose renewals cannot reach a
//     majority is reported lost at the end of its validity.
//   - A lock key deleted or expired early on a minority: the lock stays
//     held on the rest; on a majority: the holder learns of it at its next
//     renewal (within TTL/3) and reports the loss.
//   - Network delay or pauses beyond the drift allowance: two holders may
//     overlap; fencing tokens still order them (see above).
//   - A node that forgot its counter: see "Fencing tokens".
//
// Each round's requests run on goroutines of their own; the caller stops
// waiting at the node timeout, at its context's end or at Close. An error
// that wraps context.DeadlineExceeded or context.Canceled means the
// caller's context ended; a node's own timeout is reported as "no answer
// within the node timeout". Close waits for requests still in flight, and
// for the Pub/Sub connections to close, at most 250ms (a request to a node
// that stopped answering ends at its node timeout, a Pub/Sub command or
// reconnect at the node timeout plus up to 1s for dialling, on the socket
// when the client has ContextTimeoutEnabled): with clients the caller owns
// (New), that work may outlive Close until then. With clients of its own
// (Open) Close closes them and their connections, which ends it at once.
//
// # Known limits
//
//   - A Pub/Sub reconnect signals "subscribed" when go-redis has re-sent the
//     subscriptions, a little before the node confirms them; a release in
//     between can go unheard, and the waiter then wakes by its back-off
//     (at most the retry interval). Safety does not depend on it.
//   - The proof assumes no acquire request of holder A is still on its way
//     once A read the grant's reply. go-redis may send a request again on a
//     new connection when the first one's reply is lost; if the first copy
//     is held in the network (a partition) and reaches its node much later,
//     after A's lock there ended early and a later holder B acquired and
//     released, it grants A's owner token there again. A fenced resource
//     still rejects A's token, which is lower than B's; but a renewal of A
//     would count that node as holding A's lock.
package redlock
