// Package postgres implements locker.Locker with PostgreSQL session-level
// advisory locks (pg_advisory_lock), on a pgx v5 connection pool.
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
// polling. The wait goes in slices of one health-check interval (a
// lock_timeout for that statement only), so that a waiting connection is
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
// DDL, use WithoutDDL and create it once:
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
// key space. Distinct keys collide only by a 64-bit hash collision; a
// collision makes two keys exclude each other (false contention), never
// grants one lock twice. Advisory locks taken directly with small integers,
// by other software on the same database, share the key space too.
//
// # Failure modes
//
// A lock ends with its session. There is no lease: locker.WithTTL is
// validated (it must be within locker's portable range [locker.MinTTL,
// locker.MaxTTL], as on every backend) and reported by Handle.TTL, but not
// yet enforced by the server. What bounds how long
// a dead holder blocks others is how fast the server notices the session is
// gone:
//
//   - holder process killed, or its connection closed: at once (the kernel
//     closes the socket and the backend sees EOF);
//   - holder's machine or network gone silently: the server's TCP keepalive.
//     Set tcp_keepalives_idle, tcp_keepalives_interval and
//     tcp_keepalives_count (e.g. 10s, 5s, 3: about 25s), and tcp_user_timeout
//     (e.g. 30s) for data in flight.
//
// A held lock's connection is idle between health checks, and
// idle_session_timeout (PostgreSQL 14+, per role, database or session)
// ends sessions idle that long, freeing their locks at once, while the
// server's FATAL message may still be on its way to the holder. So the
// session that holds a lock has it turned off (set_config, one more round
// trip after the grant, only when it is on), and the release sets it back
// before the connection returns to the pool: a held lock outlives the
// timeout. idle_in_transaction_session_timeout does not apply (a session
// lock is held outside any transaction); a LockTx transaction that it
// aborts takes its lock and its writes with it. A proxy, load balancer or
// NAT between client and server that drops connections idle for some time
// ends the session as surely, and may tell the server before the holder:
// keep WithHealthCheckInterval below its idle timeout, so that the health
// checks keep the link busy (tested with a proxy that drops idle links).
//
// The holder learns of the loss through a health monitor on each held lock.
// A session that the server ends (pg_terminate_backend, shutdown, restart,
// connection reset) is noticed at once: the monitor waits on the idle
// socket, and the server's FATAL message or EOF wakes it. (The monitor
// starts 10ms after the grant, so that short holds cost nothing more; an
// end within those 10ms is noticed when it starts.) A silent link is
// noticed by a check every WithHealthCheckInterval (default 5s) that must
// answer within one interval and find the lock still held by the same
// backend; so a cut-off holder hears of the loss within about two intervals.
// Then Done is closed, Err wraps locker.ErrLost, and the connection is
// closed, which, if the server still sees the session, frees the lock. The
// Locker never reconnects behind a handle's back.
//
// A partition that heals costs a held lock nothing if it is shorter than one
// interval, less the delay TCP's retransmission adds (a few hundred
// milliseconds after a short one): a check sent during it is answered once
// it heals, within its deadline, and the server never stopped seeing the
// session. One longer than two intervals always ends the lock; in between it
// depends on where the partition falls between checks.
//
// A waiting Acquire is checked the same way. Each slice of its wait ends on
// the server after one interval, with an answer; when none has come one
// interval later, the link is taken for dead, the connection is closed and
// Acquire fails with an error of its own (never ErrNotAcquired). So the
// server drops a cut-off waiter from its queue within an interval by itself,
// and a lock it granted the waiter in the meantime, which the waiter never
// saw, is freed as a cut-off holder's is: when the server sees the close.
// A cut-off waiter never holds a lock it does not know of for longer than a
// cut-off holder would.
//
// When the server ends a session on its own (pg_terminate_backend, restart,
// or its keepalive or tcp_user_timeout giving up on a silent client), it
// frees the lock at once, and another client may take it before the old
// holder's Done closes: the holder hears of it a moment later in the first
// two cases, and within two intervals of the link going silent in the last.
// Keep the server's timeouts above twice the health-check interval, so that
// a cut-off holder gives up first, and fence writes with the token for the
// cases no timeout can order.
//
// A failed Release leaves nothing held: the connection is closed (behind a
// session pooler, the pooler's reset query must then unlock; see Poolers).
//
// # Pool sizing
//
// Each held lock pins one connection, and a waiting Acquire pins one too.
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
//	token_base=N                WithTokenBase    (shared)
//	lock_health_interval=5s     WithHealthCheckInterval
//	lock_sequence=SCHEMA.NAME   WithSequence
//	lock_session_pooler=true    WithSessionPooler
//
// The other shared parameters, ttl, drift_margin and retry_interval, are
// checked and change nothing here (an advisory lock lasts as long as its
// session, and the server wakes waiters); watchdog=false is refused.
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
package postgres
