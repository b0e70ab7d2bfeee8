// Package postgres implements locker.Locker with PostgreSQL session-level
// advisory locks (pg_advisory_lock), on a pgx v5 connection pool, and the
// lock families locker.Semaphorer and locker.ReadWriter (see Lock
// families).
//
// # What it promises
//
// A lock on a key is a session advisory lock on a bigint derived from the key
// (see AdvisoryKey), held by one server session. PostgreSQL grants it to one
// session at a time, so two holders of one key never overlap while their
// sessions live — across goroutines, Lockers and processes that use the same
// database and namespace. Each held lock pins its own connection of the pool
// for as long as it is held: session locks belong to a session, and two
// handles sharing one would both "hold" the lock, since PostgreSQL grants a
// session the same lock again.
//
// Acquire waits on the server (pg_advisory_lock): waiters queue in
// PostgreSQL, and the next is granted the instant the holder unlocks — no
// polling. The wait goes in slices of one health-check interval, or a
// third of the TTL if that is shorter (a lock_timeout for that statement
// only), so that a waiting connection is
// checked as a held lock is (see Failure modes); at each slice's end the
// waiter joins the server's queue again at the back, so waiters are served
// about, not exactly, in the order they came. When ctx ends first, a cancel
// request stops the server-side wait (a lock granted in that same instant is
// given back), so an abandoned wait leaves no backend queued behind; Acquire
// returns once that is done, a round trip after ctx ended — or, when the
// link is dead and nothing can reach the server, after at most a second,
// leaving the connection to be closed in the background. TryAcquire uses
// pg_try_advisory_lock; it does not wait for the holder, but it does wait
// for a free connection of the pool, as long as ctx allows (see Pool
// sizing): give it a deadline where it must not block.
// Release runs pg_advisory_unlock and returns the connection to the pool;
// if the unlock fails the connection is closed, never returned holding a
// lock. Locks are not reentrant: a second Acquire of a held key from the same
// Locker takes another connection and waits.
//
// # Fencing tokens
//
// Each acquisition draws a token from a sequence (default locker_fence, see
// WithSequence), in the statement that takes the lock, after the grant. The
// next holder is granted only after this one unlocked, so its nextval comes
// later and is higher: tokens strictly increase per key, also across
// crashes, restarts and Lockers — provided every Locker locking the same keys
// uses the same sequence, and the sequence has a positive INCREMENT,
// MINVALUE 1 or more, CACHE 1 and NO CYCLE (the Locker checks this once, at
// its first lock, and refuses otherwise). One sequence serves every key. The Locker creates it on first use; where the application may not run
// DDL, use WithoutDDL and create it once (and see "TLS and least
// privilege" for the role's other rights):
//
//	CREATE SEQUENCE IF NOT EXISTS locker_fence AS bigint MINVALUE 1 NO CYCLE CACHE 1;
//	GRANT USAGE ON SEQUENCE locker_fence TO app_role;
//
// A token is only as durable as the sequence: nextval survives a server crash
// when synchronous_commit is on (the default), and a failover only to a
// synchronous standby. After promoting an asynchronous standby, which may
// have missed the last values handed out, move the sequence well past them
// before clients lock again, or a new holder could get a lower token than a
// stale one:
//
//	SELECT setval('locker_fence', (SELECT last_value FROM locker_fence) + 1000000);
//
// WithTokenBase(n) (token_base=n) adds n to every token the Locker hands
// out, LockTx's included; the sequence itself is unchanged (see
// locker.MaxTokenBase). The sequence grows by one per acquisition from 1,
// so it stays far below 2^62, and n + token, with n at most 2^62, fits an
// int64; a value beyond that (a sequence set there by hand) makes the
// acquisition fail with an error naming token_base, the lock given back.
//
// # Keys and namespaces
//
// Keys are hashed with the prefix (WithPrefix) into the 64-bit advisory
// key space, each lock family in a keyspace of its own: the mutex "k", the
// reader-writer lock "k" and the semaphore "k" are three locks, hashed
// under three domains (AdvisoryKey, ReadWriteKey, SemaphoreKey). Distinct
// (family, prefix, key) collide only by a 64-bit hash collision; a
// collision makes two keys exclude each other or queue together (false
// contention; for two semaphores of different limits, a false
// ErrLimitMismatch), never grants one lock twice. Advisory locks taken
// directly with small integers, by other software on the same database,
// share the key space too; the families also use the two-int4 form of
// advisory keys with the top bits of the first int4 set (see Lock
// families), which such software should leave alone.
//
// # Failure modes
//
// A lock ends with its session, and its TTL (locker.WithTTL, else
// WithDefaultTTL, else locker.DefaultTTL, within locker's portable range
// [locker.MinTTL, locker.MaxTTL]) bounds how long the server keeps the
// session of a holder that went silent: its machine or network gone, its
// process hung, or its close lost on the way. The session that holds a lock
// gets, in the statement that grants it, a setting any role may set for its
// own session, and the statement that unlocks it sets it back to what it
// was before the connection returns to the pool; a connection whose lock
// was lost, or whose unlock failed, is closed, never pooled:
//
//   - idle_session_timeout (PostgreSQL 14+) = the TTL, to the millisecond:
//     the server ends a session idle that long, and frees its locks. This is
//     the lease, and Handle.TTL reports it. The holder's health checks (see
//     below) come at least every third of it, and each one starts the
//     server's timer again.
//   - On PostgreSQL 13 and older, which lack it: tcp_keepalives_idle,
//     tcp_keepalives_interval, tcp_keepalives_count and (12+)
//     tcp_user_timeout, derived from the TTL (idle and interval a quarter of
//     it, in whole seconds, and as many probes as fit), so that the server's
//     kernel drops the connection of a peer that is gone within the TTL
//     rounded down to whole seconds, at least 2s, which Handle.TTL then
//     reports. They cannot tell a hung holder process, whose kernel still
//     answers, from a live one, and do nothing on a Unix-domain socket.
//     (On 14+ they would add no case to idle_session_timeout for a session
//     idle but for its health checks, and cost about half again the time of
//     an uncontended acquisition; the server's own settings for them still
//     apply.)
//
// So a holder cut off from the server, by a partition that loses its close
// too, keeps others from the key for at most its TTL after the server last
// answered it (measured with TTLs of 2s and 5s: another client held the key
// within the TTL of the link going silent, 30ms past it at worst, and the
// holder had reported the loss at least its drift margin before). A holder
// process that is killed, or closes its connection, frees its locks at once
// (the kernel closes the socket and the backend sees EOF).
//
// The session that holds a lock thus has an idle_session_timeout of its TTL
// whatever the role, database or pool sets: a shorter one (which ends
// sessions idle between health checks, freeing their locks while the
// server's FATAL message may still be on its way to the holder) does not
// apply to it, and a longer one, or none, does not keep a silent holder's
// lock past its TTL. idle_in_transaction_session_timeout does not apply (a
// session lock is held outside any transaction); a LockTx transaction that
// it aborts takes its lock and its writes with it. A proxy, load balancer
// or NAT between client and server that drops connections idle for some
// time ends the session as surely, and may tell the server before the
// holder: keep WithHealthCheckInterval below its idle timeout, so that the
// health checks keep the link busy (tested with a proxy that drops idle
// links).
//
// The holder learns of the loss through a health monitor on each held lock.
// A session that the server ends (pg_terminate_backend, shutdown, restart,
// connection reset, its idle_session_timeout) is noticed at once: the
// monitor waits on the idle socket, and the server's FATAL message or EOF
// wakes it; the monitor starts right after the grant. (The server frees the
// lock when it sees the session end, the holder when its monitor reads the
// socket: when both ends learn of a reset at once, the two race, and a
// client that acquires within that moment, microseconds on a loaded machine
// to a few milliseconds, can hold the key before the holder's Done()
// closes; fencing tokens cover that window.) A
// silent link is noticed by a check every WithHealthCheckInterval (default
// 5s), or every third of the TTL if that is shorter, that must answer within
// one interval and find the lock still held by the same backend. The holder
// also counts its lease: once no statement has been answered within the TTL
// less a drift margin (WithDriftMargin; by default TTL/50 + 100ms, at most
// TTL/4) of the moment it was sent, the lock is lost. The server started its
// idle timer only once it had answered, so the holder reports the loss
// before the server can free the lock: within about two intervals of the
// link going silent, and at the latest a drift margin before the TTL runs
// out. Then Done is closed, Err wraps locker.ErrLost, and the connection is
// closed, which, if the server still sees the session, frees the lock at
// once. Err and Done look at the clock too, so that a holder resumed from a
// pause past its lease (a GC pause, a stopped process) is told at its first
// look, not only once its monitor has run. The Locker never reconnects
// behind a handle's back.
//
// A partition that heals costs a held lock nothing if it is shorter than one
// interval, less the delay TCP's retransmission adds (a few hundred
// milliseconds after a short one): a check sent during it is answered once
// it heals, within its deadline, and the server never stopped seeing the
// session. One longer than two intervals always ends the lock; in between it
// depends on where the partition falls between checks.
//
// A waiting Acquire is checked the same way. Each slice of its wait ends on
// the server after one interval (or a third of the TTL), with an answer;
// when none has come one slice later, the link is taken for dead, the
// connection is closed and Acquire fails with an error of its own (never
// ErrNotAcquired). So the server drops a cut-off waiter from its queue
// within a slice by itself, and a lock it granted the waiter in the
// meantime, which the waiter never saw, is freed as a cut-off holder's is:
// when the server sees the close, or, if it never does, by the lease the
// grant set on the session. A cut-off waiter never holds a lock it does not
// know of for longer than a cut-off holder would.
//
// When the server ends a session on its own initiative, not for silence
// (pg_terminate_backend, restart), it frees the lock at once, and another
// client may take it before the old holder's Done closes: the holder hears
// of it a moment later. Fence writes with the token for the cases no
// timeout can order.
//
// A failed Release leaves nothing held: the connection is closed (behind a
// session pooler, the pooler's reset query must then unlock; see Poolers).
//
// # Lock families
//
// The Locker has semaphores (locker.Semaphorer: AcquireSemaphore,
// TryAcquireSemaphore) and reader-writer locks (locker.ReadWriter:
// AcquireRead, AcquireWrite and their Try forms); locker.Semaphore,
// locker.ReadLock and locker.WriteLock make them Lockers. Every permit,
// read lock and write lock is a Handle like a lock's: it pins a
// connection, keeps its lease on its session (see Failure modes) with the
// same health checks, reports its loss by Done and Err, and has a fencing
// token from the same sequence.
//
// Algorithm. Each key of a family has a queue, kept in PostgreSQL's lock
// table by session advisory locks. A participant — a holder, or a waiter —
// holds the key's member lock (SemaphoreKey, ReadWriteKey) in share mode,
// an identity lock that encodes its ticket, a value of the token sequence
// drawn as it joined, and an attribute lock saying reader or writer, or
// the semaphore's n. It joins in one statement under the key's gate (a
// transaction lock on the member key's domain with "/gate" added): the
// statement lists the participants from one pg_locks snapshot, decides,
// draws the ticket and takes the locks, so a key's tickets follow the
// order of arrival. A participant is admitted when those before it allow:
// a writer when nobody is before it, a reader when no writer is, a
// semaphore's participant when fewer than n are. One that is not admitted
// waits in the server's lock manager for one lock of one participant
// before it: a writer for the identity of the last one, a reader for the
// identity of the last writer (readers waiting for the same writer are
// woken together), a semaphore's waiter for the waiting lock of the
// waiter two ahead of it (the second waiter: of the first), which that one
// gives up when it is admitted. The first waiter of a semaphore, which
// must wake when any of the n holders leaves, LISTENs on the key's channel
// instead, and a Release of a permit NOTIFYs it; the second listens
// already, so that it takes over without a round trip more, and no other
// does. Woken, a waiter lists the participants before it again and
// decides. No release wakes a herd: a participant's leaving wakes only
// those that wait on it — the readers behind a writer (all admitted
// together), or one writer, or two semaphore waiters (the new first and
// the new second) — and a permit's release the first waiter.
//
// Why not PostgreSQL's own queue (pg_advisory_lock_shared for readers, n
// advisory slots for a semaphore): that queue is first come, first served
// — a shared request waits behind a waiting exclusive one, and
// pg_try_advisory_lock_shared fails then — but only for a waiter that
// stays in it, and waits here go in slices (see Failure modes). A waiter
// whose slice ends leaves the server's queue, which lets in the readers
// queued behind it (measured: a reader queued behind a writer was granted
// the instant the writer's lock_timeout fired), and joins again at the
// back: a writer behind readers that overlap for longer than a slice would
// never get its turn. Here a waiter keeps its place across slices: its
// ticket orders it, not the server's queue.
//
// Fairness: first come, first served per key, readers and writers alike
// (so a stream of readers never starves a writer), and readers that queue
// together are admitted together; a semaphore's permits go to waiters in
// the order they came. A TryAcquire fails when anyone waits first: a
// reader's when a writer waits, a permit's when others wait for one. A
// waiter that gives up leaves the queue, which wakes those behind it (the
// readers behind a writer that gave up are admitted at once).
//
// Tokens. A participant admitted as it joins takes its ticket as its
// token; one admitted after waiting draws a token in the statement that
// admits it. Since admission follows the queue, a writer's token is above
// the tokens of every reader and writer granted before it, a reader's
// above those of every writer before it, and permits' tokens increase in
// the order of their grants — across readers, writers and permits of all
// keys, the sequence being one.
//
// Limits. A semaphore's n is checked as a participant joins, under the
// gate, against the attribute of every participant, holders and waiters:
// another n fails at once with an error wrapping locker.ErrLimitMismatch
// (from Acquire too), and nothing is registered. Once a key has no
// participant, any n goes.
//
// Failure modes are those of the mutex, with the lease set on the session
// as it joins the queue: a waiter that goes silent leaves it within its
// TTL (the server ends the idle session), and a holder keeps its lease as
// a lock does. A participant whose session ends — released, lost, killed,
// terminated by an operator, or silent past its lease — loses all its
// locks at once, which wakes whoever waits on one of them; a permit freed
// that way, not by a Release, sends no notification, and the semaphore's
// first waiter finds it when its slice ends: within one health-check
// interval (or a third of the TTL) after the server freed it. So a
// killed holder's permit comes back within a slice, a silent one's within
// its TTL and a slice. A waiter whose ctx ends leaves the queue on its
// session (or closes it, when a cancel request may still be under way);
// one whose link stops answering for two slices closes its connection and
// fails, as the mutex's waiter does. A wait does not end at a slice's end
// on the server, nor at the session's statement_timeout or lock_timeout:
// it goes on, in its place.
//
// Cost: joining reads pg_locks once (a scan of the server's lock table,
// which briefly holds every lock partition), and so does each wake-up; a
// participant holds three advisory locks, four while a semaphore's waiter
// waits (max_locks_per_transaction × max_connections bounds the server's
// locks).
//
// # Inspect
//
// Locker implements locker.Inspector for the mutex: Inspect finds the
// session that holds the key's advisory lock in pg_locks, and reads the
// holder's token and locker.WithOwner description from that session's
// application_name in pg_stat_activity. The statement that grants a mutex
// sets application_name on the holding session, with the lease's
// settings, to "locker <token> <description>" (the description %-escaped
// to printable ASCII), and the unlock sets it back: while a connection
// holds a lock, pg_stat_activity names it, and operators can find it there
// too. pg_stat_activity shows 63 bytes of it, so a description longer than
// about 50 bytes is cut. TTL and Lease are 0: the lease is the session's
// idle_session_timeout, which other sessions cannot read. A lock held by
// other software or by LockTx shows as held, with Token 0 and no Owner.
//
// # Pool sizing
//
// Each held lock pins one connection, and a waiting Acquire pins one too;
// so do each permit, read lock and write lock, and each of their waiters.
// Size pool_max_conns (pgxpool default: max(4, number of CPUs)) for the
// largest number of locks held or awaited at once, plus what the rest of the
// program uses, and the server's max_connections for all pools together.
// When no connection is free, Acquire and TryAcquire — TryAcquire too, which
// never waits for a holder — wait for one as long as ctx allows, then fail
// with an error wrapping ErrPoolExhausted and ctx's error. A goroutine that
// holds locks and waits for another while the pool is exhausted waits for
// itself: give such waits a deadline.
//
// # Poolers (PgBouncer)
//
// Session locks need a connection that keeps its server session: a direct
// connection or a session-mode pooler. Behind a transaction-mode pooler
// consecutive statements may run on different server sessions, and a lock
// "held" by one would be granted again to another client whose transaction
// lands on the same server session. No test tells the two modes apart for
// sure (a transaction pooler may route two statements to the same session by
// chance), so the Locker refuses by default any connection that goes through
// a pooler or proxy, recognised by a backend pid that differs from the one
// announced at connect time, with an error wrapping ErrPooler that says what
// to do. Declare a session-mode pooler with WithSessionPooler; the Locker
// then still checks, after each grant and at each health check, that the
// statements land on the backend that holds the lock, and refuses (or
// reports the lock lost) when they do not. A lock left on a pooler's server
// session by a refused grant is unlocked on that session when a statement
// reaches it, else it stays until the pooler closes the session.
//
// Behind a session pooler, closing a connection does not end its server
// session: the pooler keeps the session for its next client, and what frees
// the locks is its reset query (PgBouncer: server_reset_query, by default
// DISCARD ALL, which unlocks every advisory lock). With a reset query that
// does not (an empty one, say), the lock of a holder that died, lost its
// lock or failed a Release stays on the session and passes to the pooler's
// next client of it. Keep DISCARD ALL, or add SELECT pg_advisory_unlock_all().
// A Locker declared WithSessionPooler checks, before each lock, that the
// session it got holds no advisory lock yet, and refuses one that does with
// ErrPooler (a lock on it could be granted twice, and outlive its unlock).
//
// Behind transaction-mode poolers use LockTx and TryLockTx: they take
// transaction-scoped locks (pg_advisory_xact_lock) inside a pgx.Tx, which
// the pooler keeps on one server session, and those end with the
// transaction. With PgBouncer before 1.21, also set
// default_query_exec_mode=exec (pgx's named prepared statements need 1.21's
// max_prepared_statements).
//
// # URL
//
// The package registers the schemes postgres and postgresql with locker.Open:
//
//	postgres://user:password@host:5432/db?sslmode=require&pool_max_conns=20&prefix=billing
//
// The URL is a libpq connection URL as pgxpool.ParseConfig reads it, plus
// these parameters of ours, removed before pgx sees the URL:
//
//	prefix=NAME                 WithPrefix       (shared by every backend; see backend.Settings)
//	ddl=false                   WithoutDDL       (shared)
//	ttl=30s                     WithDefaultTTL   (shared)
//	drift_margin=700ms          WithDriftMargin  (shared)
//	token_base=N                WithTokenBase    (shared)
//	lock_health_interval=5s     WithHealthCheckInterval
//	lock_sequence=SCHEMA.NAME   WithSequence
//	lock_session_pooler=true    WithSessionPooler
//
// The shared retry_interval is checked and changes nothing here (the server
// wakes waiters); watchdog=false is refused (a held lock is always kept).
//
// Of the other parameters, Open accepts those that pgx reads, and passes
// them to it as written:
//
//   - connection: host, port, dbname, user, password, passfile,
//     connect_timeout, target_session_attrs, service, servicefile,
//     min_protocol_version, max_protocol_version, channel_binding,
//     require_auth;
//   - TLS and Kerberos: sslmode (and ssl=true, the same as
//     sslmode=require), sslkey, sslcert, sslcertmode, sslrootcert,
//     sslnegotiation, sslpassword, sslsni, krbspn, krbsrvname;
//   - pgx: statement_cache_capacity, description_cache_capacity,
//     default_query_exec_mode;
//   - pgxpool: pool_max_conns, pool_min_conns, pool_min_idle_conns,
//     pool_max_conn_lifetime, pool_max_conn_lifetime_jitter,
//     pool_max_conn_idle_time, pool_health_check_period, pool_ping_timeout;
//   - server settings sent at connect time: application_name, options,
//     search_path, timezone.
//
// Every other parameter — a misspelt option, an unknown lock_ one, a libpq
// parameter that pgx does not support — is rejected with an error wrapping
// locker.ErrInvalidURL that names it: pgx would send it to the server as a
// run-time setting, and every connection would fail. Give other server
// settings in options, as libpq does, with spaces written %20:
//
//	postgres://app@db/app?options=-c%20statement_timeout%3D5s%20-c%20lock_timeout%3D1s
//
// Open does not contact the server (like database/sql.Open, and the redis
// backend's Open): an unreachable server, a wrong password or a setting the
// server refuses fails the first Acquire or TryAcquire. Errors never show
// the password. A Locker opened from a URL owns its pool and closes it in
// Close; one built with New leaves the caller's pool open.
//
// # At risk and logging
//
// A Handle is a locker.AtRisker: at risk while a health check of its
// connection has not answered in half the time it is given (a partition, a
// stalled server), until one answers; a check that fails or runs out of time
// loses the lock. WithLogger logs the lock at risk and cleared and its loss
// and why; nothing without it.
//
// # TLS and least privilege
//
// Over a network, verify the server: sslmode=verify-full with sslrootcert
// naming the PEM file of the CA that signed the server's certificate (pgx
// checks the chain and that the certificate names the URL's host):
//
//	postgres://app:secret@db.internal:5432/app?sslmode=verify-full&sslrootcert=/etc/app/db-ca.pem
//
// A certificate from another CA fails the first call with x509's
// "certificate signed by unknown authority", a wrong password with the
// server's "password authentication failed for user", a server that wants
// TLS from a client without it with pg_hba's "no encryption"; each wrapped
// with the call ("try-acquire KEY: ..."), none showing the password. The
// integration tests run the conformance suite over verify-full against a
// server that takes only TLS and SCRAM passwords, with a CA the test makes.
//
// The role a Locker connects as needs no more than:
//
//	CREATE ROLE app LOGIN PASSWORD '...';
//	GRANT CONNECT ON DATABASE app TO app;
//	GRANT USAGE ON SCHEMA public TO app;          -- the schema of the sequence
//	-- once, as a role that may create it (then use WithoutDDL, ddl=false):
//	CREATE SEQUENCE IF NOT EXISTS locker_fence AS bigint MINVALUE 1 NO CYCLE CACHE 1;
//	GRANT USAGE ON SEQUENCE locker_fence TO app;
//
// Advisory locks, pg_locks, LISTEN/NOTIFY and the session settings the
// Locker makes (idle_session_timeout, application_name) need no grant. The
// integration tests run the conformance suite as such a role, in a
// database where PUBLIC has no right at all (no CONNECT, no TEMP, no
// USAGE or CREATE on public). A role without one of these rights fails its
// first call, before any lock is taken: without CONNECT with the server's
// "permission denied for database"; without USAGE on the sequence with
// "role app may not use fencing-token sequence locker_fence (nextval needs
// USAGE on it): GRANT USAGE ON SEQUENCE locker_fence TO app"; without USAGE
// on any schema of its search_path with an error that says so and what to
// grant.
package postgres
