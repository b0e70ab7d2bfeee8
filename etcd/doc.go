// Package etcd is the etcd backend of locker: a lease and a key per
// contender, the oldest key (smallest create revision) holding, each
// waiter watching only the key just before its own, revision-guarded
// release, fencing tokens from the holder key's create revision, and a
// loss report timed by the client's own clock. It has every lock family:
// the mutex, reader-writer locks and semaphores (see "Lock families"). It runs on the official
// client, go.etcd.io/etcd/client/v3, and fixes what users of its
// concurrency.Mutex keep running into: no way to learn that the mutex is
// no longer held, a stale Unlock deleting a newer holder's key, a waiter
// key left behind by a compacted or cancelled wait, cleanup that hangs
// while etcd is down, and no fencing token.
//
//	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"etcd1:2379", "etcd2:2379"}})
//	...
//	l := etcd.New(cli, etcd.WithPrefix("/myapp/locks"))
//	defer l.Close()
//	h, err := l.Acquire(ctx, "invoice/42", locker.WithTTL(15*time.Second))
//	...
//	defer h.Release(ctx)
//
// # What it promises
//
// While no fault occurs, at most one holder has a key, across goroutines,
// Lockers and processes that use the same cluster and prefix. Waiters get
// the key in the order they asked (fair), each woken by the deletion of
// the key just before its own: one release wakes one waiter. Every
// acquisition returns a fencing token larger than that of every earlier
// holder of the key. A holder learns that its lock is lost (Done is
// closed, Err wraps locker.ErrLost) before the server can give the key to
// anyone else, as long as clocks run at about the same rate (see "Failure
// modes"). Release deletes only the holder's own key, and only while it
// is still the key the holder created.
//
// # Leases
//
// A Locker grants one etcd lease per TTL in use and shares it among all
// its locks of that TTL, as concurrency.Session does; it is granted on
// first use, and a lease that is lost is replaced by the next Acquire. The
// lease of the Locker's default TTL is kept until Close. A lease for
// another TTL (locker.WithTTL, compared in whole seconds) is given up once
// no lock or waiter has been on it for one TTL (at most 30s): it is no
// longer renewed, and revoked (should the revocation fail, the server
// expires it one TTL later). So a Locker given many different TTLs does
// not keep renewing a lease for each of them. The alternative, a lease
// per lock, gives each lock its own lifetime but costs two more raft
// writes per acquisition (grant and revoke) on top of the key's put and
// delete; sharing costs exactly one write to acquire and one to release.
// The price of sharing is that a lost lease loses every lock on it at
// once, which is what happens anyway when the process or its link dies.
//
// Every TTL of locker's portable range [locker.MinTTL, locker.MaxTTL] (1s
// to 24h) works; locks without locker.WithTTL use locker.DefaultTTL (30s)
// or WithDefaultTTL. etcd counts TTLs in whole seconds: the TTL asked of
// the server is rounded down to a second (a shorter lease, the safe
// direction). The server may raise a short TTL to its own minimum (1.5
// election timeouts rounded up: 2s with the default --election-timeout of
// 1000ms, so a 1s TTL gets a 2s lease); the Locker then uses the TTL the
// server granted, and reports it in Handle.TTL and in Inspect's
// LockInfo.Lease (the lease's GrantedTTL).
//
// The Locker renews each lease every third of its TTL (KeepAliveOnce, one
// request at a time, each bounded by that interval, so that a member that
// hangs costs one attempt and the next goes to another member), through
// the lease keeper the lease-based backends share (runtime timers, no
// goroutine while idle). After each confirmed renewal it computes the
// lease's deadline on its own monotonic clock:
// (when the renewal was sent) + (the TTL the server granted) − (drift
// margin, WithDriftMargin, default a tenth of the TTL); a grant answered
// later than a third of the TTL (an election in progress) is followed at
// once by a renewal, so the lease does not start close to its deadline.
// The server restarts its clock only when the request arrives, later than
// it was sent, so the deadline comes before the earliest moment the server
// can expire the lease. When the deadline passes without a newer renewal,
// or the server answers that the lease is gone, every lock on the lease is
// reported lost and the lease is no longer renewed: a member that hangs or
// a partition cannot delay the report.
//
// # How it works
//
// A key's lock directory is <prefix>/<EncodeKey(key)>/, default prefix
// "/locker". EncodeKey percent-escapes '%' and '/', so the directory name
// has no '/' and no directory is a prefix of another ("a" and "a/b" stay
// apart), and distinct keys get distinct directories. Prefixes must not
// nest: Lockers with the prefixes "/locker" and "/locker/x" can see each
// other's keys as lock directories (the key "x/…" of the first is under
// the second's prefix), so give unrelated users disjoint prefixes
// ("/app1/locks", "/app2/locks").
//
// Acquire sends one transaction that puts its waiter key
// <dir><lease id>-<locker nonce>-<slot> attached to the lease, if no key of
// that name exists, and reads the key of smallest create revision in the
// directory. If that is its own, it holds. Otherwise it reads, in one
// transaction, its own key and its predecessor (the key of largest create
// revision below its own), and watches only the predecessor, from the
// revision just after that read, so no deletion is missed. When the
// predecessor goes it reads again: its own key must still exist with the
// same create revision and the lease must not be lost, or the Acquire fails
// instead of returning a lock it does not hold. A watch the server ends
// (ErrCompacted, cancelled, no leader: the watch uses WithRequireLeader)
// makes it read again and watch anew; it never hangs on a dead watch.
//
// The slot is the lowest one that no other contender of the Locker for the
// same key is using, so an uncontended key reuses one name, as
// concurrency.Mutex does with its lease-named key: etcd keeps every name
// ever put under the directory in its index until the history is
// compacted, and the owner read walks them all, so a fresh name per
// acquisition made each acquisition slower than the last (1.1ms to 1.9ms
// over 3000 of them on one member). A slot is free again only once its key
// is known to be gone. Should a key of the name exist all the same, the
// new attempt takes it over, ordered by its create revision, rather than
// leave it to block every later contender.
//
// TryAcquire puts its key only if the directory is empty (a compare over
// the whole directory: create revision 0 for every key in it), in one
// round trip, and so writes nothing when the key is held or waited for.
// It makes one attempt: when the cluster does not answer (the lease grant
// or the create), it fails within three attempt windows (see below: about
// one TTL, at least 3s, at most 15s, plus at most 300ms of clean-up),
// whatever its context, with an error of its own (not ErrNotAcquired).
//
// An Acquire whose context ends, or that fails, deletes its waiter key
// (guarded by its create revision) with deadlines of its own (2s per
// attempt) rather than the caller's ended context; it waits for that at
// most 300ms before it returns, and the deletion goes on in the background
// until the server answers, the lease is lost (its keys then end with it)
// or the Locker closes (Close revokes it). A waiter key left behind would
// block every later contender, since the lease it is on is still renewed.
//
// When the create transaction itself got no answer, its put may still be
// applied later (a request held by a slow or paused member), after the
// clean-up found nothing. The Locker then keeps that name reserved (no
// contender of its own uses it again) and watches it, from the revision of
// the clean-up's read, for as long as the lease lives: a creation of it is
// deleted (guarded by its create revision) and the name freed. A Locker
// watches at most 64 such names at once; beyond that a name stays reserved
// unwatched, and a put of it that lands lasts until the lease ends (Close,
// or a loss).
//
// Every call an Acquire makes (the lease grant, the create, the waiter's
// reads) is bounded per attempt by a third of the TTL (at least 1s, at
// most 5s) and retried while its context lasts, so a member that stops
// answering while the lease stays alive costs one attempt: the client
// sends the next to another member. A create that timed out is treated as
// above (its name guarded) and made again under another name, which puts
// the contender at the back of the queue. Release retries the same way.
//
// While a lock is held, the Locker watches the holder's key (from the
// revision after its creation, starting 100ms after the acquisition from a
// runtime timer, so a short critical section costs no watch, and no event
// is missed): its deletion by anyone but Release (an operator, a revoked
// lease) reports the lock lost at once. The watches of all the keys a
// Locker holds share one gRPC watch stream, read by one goroutine: a held
// lock costs no goroutine (clientv3's Watch would run two per key), so a
// Locker holding 10,000 locks runs as many goroutines as one holding ten.
// The stream requires a leader (WithRequireLeader): a member cut off from
// its peers ends it (after about three election timeouts) instead of
// keeping it open while the majority deletes the key; the Locker then
// opens another, on whichever member the client reaches, and watches
// every held key again from its creation. A watch the server cancels (its
// start revision was compacted) makes it read the key (a linearizable
// read) and watch again; it reports a loss only when the key is gone.
//
// Release sends If(CreateRevision(key) == token) Then(Delete(key)): never a
// delete by name alone, so a stale Release after the key went to another
// holder deletes nothing. Close revokes the Locker's leases, which deletes
// every key on them at once; a Release in flight ends with it.
//
// The same transaction writes the lease's release record, the key
// <prefix>/%released/<lease id in hex> (on the lease, so it ends with it;
// in no lock directory), holding the token of the key it deleted. A
// Release whose attempt got no answer tries again; should it then find
// the key gone, the record tells whether its own attempt deleted it (the
// record names its key, or, if a later release on the lease wrote it
// since, the history shows the record written at the very revision that
// deleted the key). Release returns nil only when that is proved; a key
// taken away meanwhile (deleted from outside, its lease revoked) while
// another contender acquired, or a history compacted before it could
// tell, is reported as a loss (an error wrapping locker.ErrLost).
//
// Inspect (locker.Inspector) reads the directory's oldest key and its
// lease's remaining time (TimeToLive): two reads, no writes. A mutex
// contender's key holds its locker.WithOwner description as its value
// (written by the create itself, so it costs no request), which Inspect
// reports in LockInfo.Owner; the families' keys hold none.
//
// # Lock families
//
// The Locker also has semaphores (locker.Semaphorer: AcquireSemaphore,
// TryAcquireSemaphore, or locker.Semaphore(l, n) as a locker.Locker) and
// reader-writer locks (locker.ReadWriter: AcquireRead, AcquireWrite and
// their Try forms, or locker.ReadLock(l) and locker.WriteLock(l)). They
// are the mutex's machinery with another rule for whose turn it is: a
// waiter key per contender on the Locker's lease for its TTL (the same
// lease, renewals, loss reports, revision-guarded Release and release
// record, clean-up of abandoned waits and guarded names), ordered by
// create revision, each waiter watching one key for what can change its
// turn. Each family has a directory of its own:
//
//	<prefix>/<EncodeKey(key)>/<name>                    the mutex
//	<prefix>/%rw/<EncodeKey(key)>/r/<name>              a reader
//	<prefix>/%rw/<EncodeKey(key)>/w/<name>              a writer
//	<prefix>/%sem/<EncodeKey(key)>/<n>/<name>           a permit of a semaphore of n
//
// EncodeKey escapes '%' as "%25", so no mutex directory begins with "%r"
// or "%s", and it has no '/', so no directory is a prefix of another: the
// mutex "k", the reader-writer lock "k" and the semaphore "k" are three
// locks that never wait for each other, for every valid key.
//
// Reader-writer lock. The kind is in the key (r/ or w/), so that one range
// read finds the writers. A writer holds when no older key (reader's or
// writer's) is in the directory, and waits watching the newest older one;
// a reader holds when no older writer's key is, and waits watching the
// newest older writer's key. So readers between two writers are admitted
// together when the first writer leaves; a reader that comes after a
// waiting writer waits behind it (FIFO: a stream of readers never starves
// a writer); a writer that gives up (its key deleted) lets the readers
// behind it in at once; and a release wakes only those it admits (a
// writer's, the readers behind it up to the next writer; a reader's, at
// most the writer just behind it). TryAcquireRead creates its key only if
// no writer's key exists (If(CreateRevision(<dir>w/) == 0 over the range)),
// TryAcquireWrite only if the directory is empty: one round trip, nothing
// written when it fails.
//
// Semaphore. The n oldest keys of the directory hold a permit each; a
// waiter holds once fewer than n older keys are left. The first waiter
// (exactly n older keys) watches the directory for deletions: any holder's
// release, in whatever order, frees its permit, and its event admits the
// waiter without another read (no key can become older than the waiter's
// own, and a deletion of its own key would come first in the same
// ordered stream, failing the wait). A later waiter watches
// only its predecessor, itself a waiter, for any change: its deletion (it
// gave up, its lease ended), or a re-put of the same empty value (guarded
// by its create revision, keeping its lease) that a waiter makes of its
// own key once it holds after waiting; either may make the watcher the
// first waiter. So a release wakes one waiter, and waiters are served in
// the order they arrived. n is part of the key (<n>/), and the create of
// an Acquire requires, in the same transaction, that no key of the
// directory lies outside its <n>/ (two range compares), so a second limit
// is refused at once (an error wrapping locker.ErrLimitMismatch, also from
// an Acquire that would wait) and every holder and waiter agrees on n. A
// count cannot be compared in a transaction, so TryAcquireSemaphore
// counts the directory, and creates its key only if no key was created
// there since that count (If(CreateRevision(<dir>) < count's revision+1
// over the range)), counting again in the same transaction's Else branch
// when one was: one round trip when nobody raced it, nothing written when
// it fails.
//
// Tokens are the create revisions, as for the mutex: strictly increasing
// per key across every permit of a semaphore, and across the readers and
// writers of a reader-writer lock (a writer holds only once every older
// key is gone, so its revision is above every reader's and writer's
// before it; a reader's is above every writer's before it, since a newer
// writer waits for the reader).
//
// Costs: an uncontended lock of either family costs what the mutex costs,
// one write to acquire and one to release. A semaphore's waiter costs one
// write more once admitted (the re-put), and admissions pass through the
// first waiter one at a time (each costs the admitted waiter's re-put and
// the next waiter's read), so a burst of releases is handed to waiters in
// a chain of round trips rather than at once. On one etcd member on a
// loaded 2-core machine, 16 clients got a semaphore of 4 at 0.9-1.25
// times the mutex's rate when each held it 1ms, and at 2.4-3.4 times when
// each held it 20ms (integration/etcd BenchmarkSemaphore).
//
// Inspect (locker.Inspector) reports the mutex only.
//
// Failure modes of the families, beyond the mutex's (which all apply):
//
//   - A waiter's re-put that never lands (the holder cut off just after
//     being admitted): the waiter behind it waits until that holder's key
//     goes (its Release, or its lease's end) rather than for the next
//     release. It is retried in the background while the lock is held.
//   - A holder or waiter whose lease ends: its key goes with it; the
//     waiter that watched it reads again (a reader behind a writer that
//     gave up is admitted at once; a semaphore's next waiter moves up).
//   - A key of the directory deleted from outside counts as released or
//     abandoned, as for the mutex: its holder reports the loss.
//
// # Fencing tokens
//
// Handle.Token is the create revision of the holder's key: the revision of
// the transaction that put it. Revisions are assigned by the raft log in
// one total order, cluster-wide, and survive restarts and leader changes.
// Tokens increase per key across holders: a contender holds only when its
// key is the oldest in the directory, and every earlier holder's key was
// created before it (an older key still present would make it wait), so
// the later holder's key was put in a later transaction.
//
// WithTokenBase(n) (token_base=n) adds n to every token the Locker hands
// out and Inspect reports; guards on the server use the revision itself
// (see locker.MaxTokenBase). The revision grows by one per write to the
// cluster from 1, so it stays far below 2^62 (a million writes a second
// for 146,000 years), and n + revision, with n at most 2^62, fits an
// int64.
//
// # Failure modes
//
//   - Lease not renewed by its deadline (the cluster unreachable, no
//     leader, a partition): every lock on the lease is lost at the
//     deadline, before the server can expire the lease.
//   - Lease expired or revoked on the server (KeepAliveOnce answers "not
//     found"): every lock on it is lost; the watch on each holder's key
//     reports it too.
//   - Holder's key deleted from outside: the watch fires, the lock is lost
//     (within about 100ms plus a round trip).
//   - Lease declared lost by the client's clock while the server may still
//     keep it (renewals that reached the server but whose answers did not
//     come in time, a partition that heals): the Locker revokes the lease
//     in the background (attempts for at most one TTL), and the first
//     Release after the loss still sends its guarded deletion, so others
//     need not wait for the server to expire the lease.
//   - Waiter's key deleted, or its lease lost, while waiting: the Acquire
//     fails with an error; it never returns a lock it does not hold. A
//     waiter whose own key is deleted while its predecessor still exists
//     notices only when the predecessor goes (it then reads its own key
//     and fails); until then it waits, harmlessly.
//   - Compaction during a wait: the watch fails with ErrCompacted; the
//     waiter reads again and watches anew.
//   - A Release that cannot reach the server before its context ends gives
//     the lock up anyway (Done closes, the error says so); the guarded
//     deletion goes on in the background, and the key ends with the lease
//     otherwise.
//   - Close while etcd is down: the revocations are given 3s, and what is
//     still in flight 1s more; then Close returns, saying which locks it
//     could not release. Their lease is no longer renewed, so the server
//     frees them one TTL later.
//   - A leader paused for longer than a TTL, then resumed: the other
//     members elect a new leader, which keeps the leases alive, and the
//     holders' renewals go on through it. But the resumed old leader may,
//     in the moment before it learns it was deposed, revoke the leases it
//     believes expired, and that revocation can commit (etcd issue #15247;
//     our tests see it on 3.4.23 and on 3.5.17 alike). The locks on such a
//     lease end at once: each holder learns it from the watch on its key,
//     in the same moment as the next waiter learns the key is free, so the
//     "loss reported before anyone else acquires" promise holds only up to
//     that race of a few milliseconds. Fence your writes with the token;
//     keep members from being paused (a frozen VM, a stopped container)
//     rather than cut off, which etcd handles cleanly.
//   - Clock rates: the holder measures the TTL on its own clock and the
//     leader on its own; the drift margin covers a rate difference of up
//     to a tenth. A holder paused longer than the TTL (GC, a stopped VM)
//     may resume before it notices the loss: fence your writes with the
//     token.
//
// # URL
//
// The package registers the schemes etcd and etcds (TLS, verified against
// the system's roots or tls_ca) with locker.Open:
//
//	etcd://[user:password@]host1:2379,host2:2379[/prefix]?ttl=10s
//	etcds://user:password@host1:2379/app?tls_ca=/etc/app/ca.pem&tls_cert=/etc/app/client.pem&tls_key=/etc/app/client.key
//
// The port defaults to 2379, except on the last host of a list: url.Parse
// reads what follows the last ':' of the whole list as one port, so the
// last host must carry one (etcd://h1,h2:2379 works, etcd://h1:2379,h2
// does not, and Open says so). An IPv6 address is bracketed ([::1] or
// [::1]:2379) and, for the same reason, can only be the one host. The
// path is the key prefix (WithPrefix; default /locker), or the parameter
// prefix (not both). A user and
// password log in with etcd's auth; a user without a password (or with an
// empty one) is an error, since etcd's client would then connect without
// authentication; no error shows the password. Parameters:
//
//	ttl=10s            WithDefaultTTL      (shared by every backend; see backend.Settings)
//	drift_margin=1s    WithDriftMargin     (shared)
//	prefix=/app        WithPrefix          (shared; or the path)
//	token_base=N       WithTokenBase       (shared)
//	dial_timeout=5s    how long the etcd client waits to log in (with user:password)
//	tls_ca=/path.pem   etcds: the CAs that verify the server (default: the system's roots)
//	tls_cert=/path.pem etcds: the client certificate, for --client-cert-auth (with tls_key)
//	tls_key=/path.pem  etcds: its private key (PEM files on the client's machine)
//
// The other shared parameters, retry_interval and ddl, are checked and
// change nothing here (watches wake waiters; etcd has no schema);
// watchdog=false is refused: the Locker always keeps its leases alive.
//
// Unknown, repeated or malformed parameters are errors wrapping
// locker.ErrInvalidURL. The Locker owns its client: Close closes it. The
// client sends gRPC keepalives (every 10s, 5s to answer), so a connection
// to a member that stopped answering is dropped and calls go to the
// others.
//
// Open contacts no server, as the redis and postgres Openers do not: the
// client connects in the background, and an unreachable cluster shows in
// the first call (the etcd client waits for a connection until the call's
// context ends). The one exception is a URL with a user and password: the
// etcd client logs in when it is made, so Open then fails, after
// dial_timeout, when no server answers or the credentials are wrong.
//
// # At risk and logging
//
// A Handle is a locker.AtRisker: at risk while the keep-alive of its lease
// fails or has not answered within its retry interval, until one succeeds
// (the locks of one lease share its risk). WithLogger logs the keep-alive
// failures, the lease at risk and cleared, and each loss and why; nothing
// without it (the etcd client's own logs stay off).
//
// # TLS and least privilege
//
// etcd's client retries a connection that fails in the background and
// waits for one until a call's context ends; for an etcds:// URL the Locker
// adds why the latest connection failed to such an error (and to Open's):
// "x509: certificate signed by unknown authority", "remote error: tls:
// certificate required" (the server wants a client certificate; when the
// server closes the connection before its alert is read, the Locker says
// that the server requested a certificate and none is configured). A wrong
// password fails Open with "authentication failed". A client you make
// yourself says only "context deadline exceeded".
//
// The least a Locker needs, with auth enabled: a role with readwrite on
// the range of its prefix and nothing else (etcdctl role grant-permission
// locker readwrite --prefix /app/, for WithPrefix("/app")): every key it
// writes, reads or watches is under <prefix>/, and leases need no
// permission. The integration tests run the conformance suite as such a
// user over TLS with client certificates. A user without it gets
// "etcdserver: permission denied" at the first call.
//
// Prefer client certificates to passwords for the Locker's identity: with
// --client-cert-auth and auth enabled, a client without a password is the
// user its certificate's common name names (an etcds:// URL with tls_cert
// and tls_key and no user). With a password, etcd's client logs in again
// (Authenticate: a bcrypt compare and a raft entry on the server) for every
// gRPC stream it opens, and each lease renewal (KeepAliveOnce) and each
// watch opens one: renewals took 130-800ms each in the tests (1-7ms
// without), enough to let 2s leases lapse on a busy server. With password
// logins, use TTLs well above the minimum.
package etcd
