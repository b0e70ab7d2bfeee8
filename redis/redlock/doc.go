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
// (WithNodeTimeout, default TTL/10 within [50ms, 3s]; a request that must
// dial gets up to 1s more: a Locker's first to each node, and one made
// when the client's pool has no idle connection; the round waits that
// long only for a node that answered the last request in time, while the
// request to a node that did not goes on dialling, so that a node whose
// round trip leaves no time for a new connection's handshake comes back
// at the next round); a node that
// grants also increments its own counter for the key (INCR, in the same
// script) and returns it. The round waits for every node's answer (or
// timeout) unless a majority has already refused. It succeeds iff
//
//   - at least N/2+1 nodes granted,
//   - the fencing token (below) is confirmed on at least N/2+1 of them:
//     the nodes whose grant returned the token itself, and those where the
//     write-back raised the counter to it while the lock was still there,
//     and
//   - the validity TTL − elapsed − drift, measured on the client's monotonic
//     clock from the moment the round's requests left, is at least a tenth of
//     the TTL.
//
// Otherwise the lock is deleted (owner-checked) on every node that may hold
// it — those that granted and those whose reply was lost — before the round
// returns; a grant that arrives after the round stopped waiting for it is
// deleted when it arrives. A round that a majority refused still waits for
// the other nodes' answers as long again as the majority's took (at least
// a millisecond): most are refusals, which need no clean-up, and the
// answer in flight comes sooner than a clean-up's round trip would.
// TryAcquire makes one round; Acquire retries (see
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
// the round ends as soon as a majority has answered either way. Renewals
// of one TTL that come due within 50ms (at most TTL/60) of each other go
// out as one round, a script of up to 128 keys per node, and each lock gets
// the verdict its own round would have had from the same answers (the
// readers of a reader-writer lock renew one by one). A renewal
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
// error wraps locker.ErrLost. Each node remembers each release of the
// key for 15 seconds (a string named by the key's ":released-by:" and the
// owner token), so that a release whose
// reply was lost and which go-redis sends again is counted as done, not as
// a lock that had expired, even when other holders came and went
// meanwhile. The clean-up of a failed round is remembered the same way,
// and an acquire request of that round that reaches a node after it (one
// that waited on another connection, or in the network) is refused there
// instead of leaving a lock nobody holds until its lease ends.
//
// # Fencing tokens
//
// Each node j keeps a counter c_j per key, changed only by a grant (INCR),
// by the write-back (c_j := max(c_j, T)) and, in a lock family, by a
// refused claim (INCR, see below), so it never decreases. A
// round of holder A that got grants from the set G_A (a majority) takes as
// its candidate T_A the value v_A(j) that a majority of the nodes of G_A
// returned, when there is one; otherwise the largest value the nodes of
// G_A returned. On a node that returned T_A, c_j = T_A at the grant, while
// A's lock was there; when no majority returned T_A, the round runs the
// write-back on the nodes of G_A that returned less: if A's lock is still
// there, c_j := max(c_j, T_A). Let W_A ⊆ G_A be the nodes that returned
// T_A and those where the write-back confirmed; the lock counts as
// acquired only if W_A is a majority. Either way, every node of W_A either
// returned T_A or T_A is the largest value G_A returned: T_A ≥ v_A(j) for
// every j in W_A, which is all the proof below needs of the choice. When a
// majority returned one value there is no write-back round at all: the
// nodes' counters agree unless one missed grants (it was down or cut off,
// or a lock ended early there), and when two rounds reach the nodes in
// different orders (the woken waiter's and a newcomer's first round, which
// takes a provisional ticket from the same counter), one node gives each
// the other's value, and a majority still gave each its own: so an
// acquisition is usually one round.
//
// Claim: for two acquisitions A and B that both succeeded, if A's lock came
// first on any node of W_A ∩ W_B then T_B > T_A. In particular a holder that
// acquires after an earlier holder's acquisition completed (its lease ran
// out, it was paused, it crashed, it released) gets a larger token.
//
// Proof. W_A and W_B are majorities of the same N nodes, so they share a
// node j. Call A's confirmation on j the moment c_j ≥ T_A held with A's
// lock there: the grant, if j returned T_A, else the write-back. On j,
// A's lock was present from the grant whose value A used until at least
// that moment (the write-back checked it; A's owner token is fresh for the
// round, and no request of A that could set it again is in flight after A
// read the grant's reply); likewise for B. Two locks are never present on
// one node at once (SET NX), so one of these intervals ends before the
// other begins. If A's comes first, B's grant on j ran after A's
// confirmation on j, so c_j ≥ T_A then and the grant's INCR returned
// v_B(j) ≥ T_A + 1, hence T_B ≥ v_B(j) > T_A (j is in W_B). If B's came
// first, T_A > T_B by the same argument, so the order on every common node
// is the same. An acquisition B that began after A completed has its grant
// on j after A's confirmation, so A's interval came first on j. ∎
//
// The argument needs no clock: leases that expire early on some nodes, a
// clock that jumps, a holder paused for minutes, or deleted lock keys
// change which acquisitions succeed, never the order of their tokens. A
// retried acquire request (go-redis retries one whose reply was lost) that
// finds our lock returns the node's counter, read while our lock is there
// and at least its grant's value (if that is T_A, the node is confirmed as
// by its grant); one that finds it gone grants again, and its reply is the
// one used. The cost is the write-back round, one more round trip, in the
// acquisitions whose majority returned different values (see
// BENCHMARKS.md).
//
// Lock families (see "Lock families"): the write-back is a claim, a round
// of its own even when the nodes' values agree (a grant records no
// claim). The
// proof orders two acquisitions whose locks exclude each other on a node;
// two permits of a semaphore, or two readers, hold at once, and both may
// take the same largest value of a majority's counters (node 1 gives A 5
// and B 6, node 2 gives B 5 and A 6). So each node also records which
// owner claimed which token for the lock (the ":claims" sorted set), and
// the write-back on a node accepts a token only when no other owner claimed
// it there. A node that refuses answers a fresh value of its counter (an
// INCR, as a grant's), and the round claims again, on the nodes that still
// hold its grant, a token above the one refused and above every value the
// refusing nodes answered (at most 8 claims; then the round fails and is
// tried again, as after a split). The token handed out is the one a
// majority accepted, W_A in the proof, which stands as it is: claims only
// raise tokens and counters. Two owners cannot both have T accepted by a
// majority: their majorities share a node, which accepted T once. A claim
// is idempotent for its owner (a copy that go-redis sends again after a
// lost reply is accepted again), replaces the owner's own claim of a lower
// token (the round's earlier claim), and a late copy of a claim lower than
// the owner's own is refused. A node keeps the latest 1024 claims of a
// lock (once it has that many, it refuses a token below all of them, whose
// claim may have been dropped), and only as long as the longest lease of
// the lock's holders there at the last claim: a holder granted after a
// claim takes a greater token (its grant's INCR reads a counter the claim
// raised), and a holder can claim only while it holds. Uncontended, a
// family's acquisition is two rounds, the grant and the claim; a collision costs a round
// trip per claim retried (in bursts of 24 readers or permits taken at
// once, on 3 and 5 nodes, about a quarter claimed more than once, a few
// up to five times).
//
// What breaks it: a node that loses its counter — a restart without
// persistence, FLUSHALL, eviction of the counter key, a failover to a
// replica that missed the latest writes. Its counter starts again from
// zero, and if it is the only node the next majority shares with the last
// write-back majority, the next token can be lower than the last (or, in
// a lock family, equal to a token still held: the node forgets its claims
// as well). Run every
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
// Waiters are queued, first come, first served, in the same queue as the
// lock families' (see "Lock families": the mutex is their writer, on its
// own names, its lock key the writer's): an Acquire whose first round
// failed is queued on the nodes that refused it, with a ticket the nodes
// agree on; it subscribes to the key's channel on every node (one Pub/Sub
// connection per node and Locker, shared by all its waiters), waits until
// a majority confirmed the subscription (at most the node timeout), and
// tries again, since a release may have come between its first round and
// the subscription. A channel stays subscribed for a second after its last
// waiter left (at most 1024 channels per node linger so): a waiter that
// finds its key's channel confirmed on a majority watches it before its
// first round, and when a majority queued it with the ticket itself, it
// skips that round (and the SUBSCRIBE and UNSUBSCRIBE): on a contended
// key a wait costs its first round, the round its wake-up starts and the
// release. Then it sleeps until a release names it (a release wakes
// the head of the node's queue only, not every waiter of the key; woken by
// fewer than a majority of the nodes' messages, it waits up to 2ms for
// the others, since a round that reaches a majority before their deletes
// is refused), or its
// back-off ends: at most the holder's remaining lease on the nodes that
// block a majority, at most the retry interval (WithRetryInterval, default
// 1s; the safety net for a lost message) and TTL/3 (the refresh of its
// place in the queue), and after a round that split the nodes between
// contenders, or that nodes refused with the lock free there (waiters
// ahead), a few milliseconds doubling, with jitter. A TryAcquire, and
// an Acquire's first round, come behind every waiter: a free lock with
// waiters queued is refused. A round that fails deletes its partial
// grants without announcing them, so contenders do not wake each other
// while the holder holds.
//
// Before this queue a release woke every waiter of the key on every node,
// and every waiter ran a round on every node: with 8 clients on one key,
// about 200 commands per acquisition; one waiter wakes now. Lockers of
// earlier releases share the lock key and exclude the new ones as before,
// but neither queue nor are woken by name: they overtake the queue when
// the lock is free, and wait for their back-off rather than a release.
//
// # Lock families
//
// Locker has semaphores (locker.Semaphorer) and reader-writer locks
// (locker.ReadWriter) as well as the mutex; locker.Semaphore,
// locker.ReadLock and locker.WriteLock make Lockers of them:
//
//	farm := locker.Semaphore(l, 3)            // at most 3 renders at once
//	h, err := farm.Acquire(ctx, "render-farm") // one permit, a Handle
//	...
//	r, err := locker.ReadLock(l).Acquire(ctx, "config")  // many readers
//	w, err := locker.WriteLock(l).Acquire(ctx, "config") // or one writer
//
// Each is a lock of its own (the mutex, the reader-writer lock and the
// semaphore of one key never wait for each other: their names on the
// nodes continue the key's encoding with ":sem" or ":rw", which no name of
// the mutex does), held, renewed, lost and released like the mutex: a
// Handle with a fencing token, a lease renewed every TTL/3 on every node,
// loss reported at the validity's end.
//
// Why they fit Redlock. A family needs two things of the nodes: safety
// (at most n permits, no reader beside a writer) and an order (waiters
// admitted first come, first served; a writer not starved by readers; a
// freed permit waking one waiter). Both are built as the mutex's lock and
// tokens are, from majorities that intersect, under the same assumptions
// (bounded drift, delay and pauses for safety; none for the order of
// tokens and tickets):
//
//   - A permit is one of n slots, each a lock key of its own on each node
//     (set only where absent, as the mutex's); a permit counts only when a
//     majority granted the same slot and the write-back confirmed it there.
//     Nodes that granted another slot (contenders met in different orders
//     on different nodes) give it back, and the next round asks for the
//     slot free on most nodes. n+1 holders at once would put two of them on
//     one slot (pigeonhole), each on a majority: two majorities share a
//     node, where one slot key holds one owner. A count of holders per
//     node would not do: on 3 nodes and n = 2, holders A{1,2}, B{1,3} and
//     C{2,3} each have a majority with no node over its count.
//   - A reader is a member of a node's set of readers, a writer a lock key;
//     a node grants a writer only with no reader and no writer, a reader
//     only with no writer. A reader and a writer both holding a majority
//     would meet on a node that granted both.
//   - Tokens come from one counter per lock and node, as the mutex's: a
//     grant increments it, the write-back raises it to the token. An
//     acquisition that begins after another one completed gets a greater
//     token (the proof in "Fencing tokens" needs no exclusion for this: the
//     later grant on a node of the earlier write-back's majority reads a
//     counter at least the earlier token). A writer and any other holder
//     exclude each other on a common node, so their tokens are ordered as
//     the mutex's are even when their acquisitions overlap: a writer's token
//     is above every reader's and writer's before it, a reader's above every
//     writer's before it. Permits and readers that hold at once get tokens
//     of their own, all the same: the write-back claims the token on a
//     majority, and a node refuses a token another owner claimed there
//     (see "Fencing tokens"), so every permit and every reader of a key
//     has a token no other holder of the key had.
//   - The order of waiters is a queue on each node (a sorted set of waiter
//     ids scored by ticket, each entry leased). A waiter takes a ticket as a
//     holder takes a token: each node gives it its next counter value, the
//     ticket is the value a majority gave (else the largest of a
//     majority's), and the waiter's next round writes it back (its entry's
//     score and the counter, on every node it reaches). So a waiter that
//     arrives after another's first round completed has a greater ticket,
//     every waiter that has run a round has the same score on every node,
//     and the nodes order the queue alike: the waiter with the smallest
//     ticket is at the head wherever it is queued, which rules out the
//     cycle of independent per-node queues (X ahead on node 1, Y on node
//     2, Z on node 3: nobody at the head of a majority). A node admits a
//     waiter in queue order only: a permit when fewer waiters are ahead of
//     it than slots are free, a reader when no writer holds or waits ahead
//     of it, a writer when nobody holds or waits ahead of it; a
//     TryAcquire, and an Acquire's first round, come behind every waiter.
//     While a waiter X keeps its entries on a majority, a
//     later waiter cannot be admitted on a majority without a node where X
//     is ahead of it: a writer is never overtaken, a reader behind a waiting
//     writer waits (TryAcquireRead fails), and readers queued together are
//     admitted together. A later permit can get in before X only where the
//     nodes' free slots differ (a give-back not yet done): as far as the
//     nodes agree, permits go first come, first served.
//   - A release (or a waiter that leaves) publishes on each node the ids of
//     the waiters that node now admits; a Locker's Pub/Sub connection wakes
//     only the waiters named, not the key's other waiters. A node that
//     refuses a round while nobody holds there publishes them too: until
//     a waiter's round reaches a node, its entry there has its first
//     round's provisional ticket and may stand ahead of a waiter that came
//     before it, so that a release wakes the wrong waiter; its round
//     corrects the entry, is refused, and the refusal wakes the head.
//
// A waiter's rounds refresh its entries (at least every RetryInterval and
// every TTL/3; the entry's lease is the TTL): a waiter that dies holds its
// place until its lease ends, as a holder that dies holds its lock, and
// the waiters behind it wait as long. A cancelled wait takes its entries
// off every node, which wakes the waiters it held back (a writer that gives
// up its wait lets the readers behind it in); a node it cannot reach then
// keeps the entry until its lease ends. A round that fails puts its waiter
// back in the queue where it had been granted; a grant or an entry that a
// late request would make after its waiter left is refused, as the mutex's
// late acquire requests are (the recent releases record the waiter's id).
//
// Costs and limits. A TryAcquire is one round. An Acquire that waits
// adds a round to take its ticket (none when its key's channel was
// subscribed before its first round and a majority agreed on the ticket:
// see "Waiting"), a round per wake-up (each with the
// claim on success, or the mutex's write-back when its nodes' values
// differ), and a withdrawal of its entry from the nodes
// that did not grant, in the background. A grant looks at every slot of
// the semaphore on the node, in one script: n is at most
// MaxSemaphoreLimit. Each node records a semaphore's n while it has
// holders or waiters there; any node that reports another n makes an
// acquisition fail with locker.ErrLimitMismatch (a holder's slot that
// expired on that node ends it; a stale record on one node is reported,
// never obeyed). Each node keeps the tokens claimed for a lock (at most
// 1024, while the lock has holders there). The scripts read the node's clock (TIME): the readers'
// and the queue entries' leases are kept as times, as PX keeps a lock's.
// A node that forgets its keys (see "Fencing tokens") forgets its queue
// too: waiters may be overtaken until their next refresh writes their
// entries back, which keeps their tickets; safety does not depend on the
// queue.
//
// # Inspect
//
// Locker implements locker.Inspector: it reads the lock on every node and
// reports the key held when one owner has it on a majority, with the token
// recorded in the lock's value ("<owner>:<token>", by the grant or by the
// write-back where one ran: the value a majority of the nodes record is
// the token; when the holder's nodes that answered have none, Inspect
// cannot tell the token and its error wraps ErrNoQuorum), the
// time until it stops holding a majority unless renewed, and the holder's
// locker.WithOwner description: the owner token is "<random> <description,
// query-escaped>" when the holder gave one, set by the same SET that takes
// the lock on each node (the lock families' holders have none).
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
//
// # At risk and logging
//
// A Handle is a locker.AtRisker: at risk from a renewal round that failed,
// or has not answered within its retry interval, until one succeeds.
// WithLogger logs the renewal failures, the lock at risk and cleared, and its
// loss and why; nothing without it.
package redlock
