// Package sqltable is a locker backend on a lock table in a SQL database:
// PostgreSQL (through pgx's database/sql driver, github.com/jackc/pgx/v5/stdlib),
// MySQL and MariaDB (github.com/go-sql-driver/mysql) and SQLite
// (modernc.org/sqlite, pure Go, no cgo). It is for teams whose only shared
// infrastructure is a SQL database, and with SQLite it is the embedded
// default: locks shared by the processes of one host with no server at all.
//
// Each database's driver is in a driver package of its own, which the
// program imports, as database/sql drivers are (see "Drivers and
// imports"):
//
//	import _ "github.com/go-locker/locker/sqltable/pgx"    // PostgreSQL: postgres+table://
//	import _ "github.com/go-locker/locker/sqltable/mysql"  // MySQL, MariaDB: mysql://
//	import _ "github.com/go-locker/locker/sqltable/sqlite" // SQLite: sqlite:
//
// # What it promises
//
// The whole contract of package locker: mutual exclusion between
// goroutines, Lockers and processes; fencing tokens that strictly increase
// per key; release and renewal that act only on the caller's own row; loss
// reported to the holder (Done, Err wrapping locker.ErrLost) before anyone
// else can take the key; every call bounded by its context. The package's
// conformance run covers all three dialects on real databases, in the
// repository's integration module.
//
// # Using it
//
// On your own *sql.DB:
//
//	import "github.com/go-locker/locker/sqltable/sqlite"
//
//	db, _ := sql.Open("sqlite", sqlite.DSN("/var/lib/app/locks.db")) // WAL, synchronous=NORMAL, busy timeout
//	l := sqltable.New(db)             // dialect detected from the driver
//	defer l.Close()                   // l does not close db
//
// (On SQLite, New refuses a *sql.DB whose connections flush to disk at
// every commit, as a plain sql.Open("sqlite", path) does: see "SQLite".)
// Or by URL, with a pool the Locker owns and closes:
//
//	sqlite:///var/lib/app/locks.db        an absolute path
//	sqlite:locks.db                       a path relative to the working directory
//	mysql://user:password@host:3306/db
//	postgres+table://user:password@host:5432/db?sslmode=disable
//	postgresql+table://...                the same
//
// (postgres:// is the advisory-lock backend, package postgres.) Query
// parameters of our own, on every scheme: those every backend shares (see
// backend.Settings), ttl (WithDefaultTTL), drift_margin (WithDriftMargin),
// retry_interval (WithRetryInterval), ddl=false (WithoutDDL),
// watchdog=false (WithoutWatchdog) and token_base (WithTokenBase) (prefix
// is refused: the table is the
// keyspace); and this package's own lock_table (WithTable), lock_max_conns (the pool's SetMaxOpenConns; default 10,
// 4 for SQLite); lock_notify=false (WithNotify(false));
// lock_file_mode (octal, default 0600) on SQLite; lock_tls_ca (a PEM file
// of the CAs that sign the server's certificate: TLS required and verified,
// see "TLS and least privilege") on mysql://. Driver parameters: on
// mysql:// tls, timeout, readTimeout, writeTimeout, allowNativePasswords and
// allowCleartextPasswords; on postgres+table:// pgx's connection settings
// (sslmode, connect_timeout, target_session_attrs, ...), its
// statement_cache_capacity, description_cache_capacity and
// default_query_exec_mode, and application_name, options, search_path and
// timezone. Any other parameter is an error wrapping locker.ErrInvalidURL
// that names it; no error repeats the password.
//
// For SQLite, Open creates the database file if it is missing, with mode
// 0600 (SQLite gives its -wal and -shm files the same mode), and fails at
// once, saying so, when the file's directory does not exist or is not
// writable. Open contacts no server.
//
// # The table
//
// The mutexes live in one table, "locker_locks" unless WithTable names another (validated as an
// identifier, optionally schema-qualified, and quoted), and a meta table of
// the same name with "_meta" appended whose schema_version row is the
// version marker a later release migrates from. The key column holds the
// whole key (no hashing, no truncation): a 1024-byte key fits on every
// dialect. A Locker creates both tables if they are missing, unless
// WithoutDDL, with the families table of semaphores and reader-writer locks
// (see "Semaphores and reader-writer locks"); the DDL of the first two is
// (see also DDL):
//
//	-- PostgreSQL
//	CREATE TABLE IF NOT EXISTS "locker_locks" (
//		lock_key   text COLLATE "C" PRIMARY KEY,
//		owner      text NOT NULL,
//		token      bigint NOT NULL,
//		expires_us bigint NOT NULL
//	);
//	CREATE TABLE IF NOT EXISTS "locker_locks_meta" (name text PRIMARY KEY, value text NOT NULL);
//	INSERT INTO "locker_locks_meta" (name, value) VALUES ('schema_version', '1') ON CONFLICT (name) DO NOTHING;
//
//	-- MySQL, MariaDB (binary columns: keys compare byte by byte)
//	CREATE TABLE IF NOT EXISTS `locker_locks` (
//		lock_key   VARBINARY(1024) NOT NULL PRIMARY KEY,
//		owner      VARBINARY(255) NOT NULL,
//		token      BIGINT NOT NULL,
//		expires_us BIGINT NOT NULL
//	) ENGINE=InnoDB ROW_FORMAT=DYNAMIC;
//	CREATE TABLE IF NOT EXISTS `locker_locks_meta` (name VARCHAR(64) NOT NULL PRIMARY KEY, value VARCHAR(64) NOT NULL) ENGINE=InnoDB;
//	INSERT IGNORE INTO `locker_locks_meta` (name, value) VALUES ('schema_version', '1');
//
//	-- SQLite
//	CREATE TABLE IF NOT EXISTS "locker_locks" (
//		lock_key   TEXT NOT NULL PRIMARY KEY,
//		owner      TEXT NOT NULL,
//		token      INTEGER NOT NULL,
//		expires_us INTEGER NOT NULL
//	) WITHOUT ROWID;
//	CREATE TABLE IF NOT EXISTS "locker_locks_meta" (name TEXT PRIMARY KEY, value TEXT NOT NULL);
//	INSERT OR IGNORE INTO "locker_locks_meta" (name, value) VALUES ('schema_version', '1');
//
// A row stays after its lock is released (owner empty, expires_us the
// database's time of the release), so that the key's next token follows on
// from its last one; Prune deletes the rows of keys unused for a long time.
//
// A Locker settles which table it uses once, at its first call, and
// qualifies the name with its schema in every statement, so that all the
// connections of its pool reach that one table whatever their search_path
// or current database. An unqualified name is, on PostgreSQL, the table it
// resolves to on the search_path if there is one, else the table CREATE
// makes in the first schema of the path (current_schema()); on MySQL, in
// the connection's database; on SQLite, in the main database. Lockers that
// must share a table whatever their connections' settings name it with
// its schema.
//
// # Holders' descriptions
//
// A holder's locker.WithOwner description is kept in the owner column,
// after the holder's random owner token and a space, written by the
// statement that takes the lock; Inspect reports it in LockInfo.Owner. No
// column was added for it, so tables of earlier releases need no change on
// PostgreSQL and SQLite. On MySQL/MariaDB, earlier releases made the owner
// column VARBINARY(64): a Locker widens it to VARBINARY(255) at its first
// call (in place: the column keeps its one length byte), unless
// WithoutDDL; with WithoutDDL, or a role that may not ALTER the table, it
// cuts descriptions to what the column holds (41 bytes in VARBINARY(64)),
// and locks work as before. To have whole descriptions there, widen it
// once yourself:
//
//	ALTER TABLE `locker_locks` MODIFY owner VARBINARY(255) NOT NULL;
//
// The families' rows carry no description.
//
// A Locker whose tables exist runs no DDL (with or without WithoutDDL;
// but for the widening of an earlier MySQL owner column above, and the
// families table added to the tables of an earlier release, see
// "Fairness", both of which it skips when refused), so a role with only
// the rights that "TLS and least
// privilege" lists is enough (PostgreSQL 15 and later and MySQL check the
// CREATE privilege for CREATE TABLE IF NOT EXISTS even when the table
// exists, which is why the Locker does not run it on existing tables).
//
// # TLS and least privilege
//
// Over a network, verify the server. On postgres+table:// with
// sslmode=verify-full and sslrootcert naming the PEM file of the CA that
// signed the server's certificate; on mysql:// with lock_tls_ca naming that
// file (TLS is then required, the chain checked, and the certificate must
// name the URL's host; tls=true alone checks against the system's CAs):
//
//	postgres+table://app:secret@db.internal:5432/app?sslmode=verify-full&sslrootcert=/etc/app/db-ca.pem
//	mysql://app:secret@db.internal:3306/app?lock_tls_ca=/etc/app/db-ca.pem
//
// (With New, give the driver's own TLS settings: pgx's DSN, or
// mysql.RegisterTLSConfig and tls=NAME in a go-sql-driver DSN.) A
// certificate from another CA fails the first call with x509's
// "certificate signed by unknown authority", a wrong password with the
// server's refusal ("password authentication failed for user",
// "Access denied for user"), each wrapped with the call ("try-acquire
// KEY: ..."), none showing the password. The integration tests run the
// conformance suite over TLS verified against a CA the test makes, on
// servers that take TCP connections only over TLS.
//
// The user a Locker connects as needs, once the tables exist (made by a
// user that may, with the statements of DDL; then use WithoutDDL,
// ddl=false):
//
//	-- PostgreSQL (also CONNECT on the database and USAGE on the schema)
//	GRANT SELECT, INSERT, UPDATE ON "locker_locks" TO app;          -- DELETE too for Prune
//	GRANT SELECT, INSERT, UPDATE, DELETE ON "locker_locks_fam" TO app;
//	GRANT SELECT ON "locker_locks_meta" TO app;
//	-- MySQL/MariaDB
//	GRANT SELECT, INSERT, UPDATE ON `locker_locks` TO 'app'@'%';   -- DELETE too for Prune
//	GRANT SELECT, INSERT, UPDATE, DELETE ON `locker_locks_fam` TO 'app'@'%';
//	GRANT SELECT, UPDATE ON `locker_locks_meta` TO 'app'@'%';
//
// (On MySQL the Locker checks, at its first call, that the connection
// counts changed rows, with an UPDATE of the meta table that changes
// nothing: hence UPDATE there.) LISTEN/NOTIFY and GET_LOCK need no grant.
// The integration tests run the conformance suite as such a user with
// ddl=false (on PostgreSQL in a database where PUBLIC has no right), and
// check that a user without any one of these rights fails its first call
// that needs it (the first TryAcquire; the first family call for the
// families table; Prune for DELETE on the lock table) with the server's
// refusal naming the table, wrapped with the call, e.g.
//
//	try-acquire "KEY": ERROR: permission denied for table locker_locks (SQLSTATE 42501)
//	try-acquire "KEY": sqltable: prepare the lock statements: Error 1142 (42000): INSERT command denied to user 'app'@'10.0.0.7' for table `app`.`locker_locks`
//
// # Semaphores and reader-writer locks
//
// A Locker has every lock family: counting semaphores (locker.Semaphorer:
// AcquireSemaphore, TryAcquireSemaphore) and reader-writer locks
// (locker.ReadWriter: AcquireRead, TryAcquireRead, AcquireWrite,
// TryAcquireWrite), which locker.Semaphore, locker.ReadLock and
// locker.WriteLock make Lockers of. Their locks are Handles like the
// mutex's: a fencing token, a lease renewed every TTL/3, loss reported
// before anyone else can be admitted, guarded Release, Close. Each family
// has a keyspace of its own: the mutex "k", the reader-writer lock "k" and
// the semaphore "k" are three locks that never wait for each other.
//
// They live in a third table, the lock table's name with "_fam" appended
// (Inspect and Prune are the mutex's; the families table keeps one small
// head row per key ever used, and a crashed holder's row until the key's
// next use):
//
//	-- PostgreSQL (MySQL: INT, VARBINARY(1024), BIGINT, VARBINARY(64), InnoDB; SQLite: INTEGER, TEXT, WITHOUT ROWID)
//	CREATE TABLE IF NOT EXISTS "locker_locks_fam" (
//		family     integer NOT NULL,       -- 1 reader-writer lock, 2 semaphore
//		lock_key   text COLLATE "C" NOT NULL,
//		seq        bigint NOT NULL,        -- 0: the key's head row; else the row's place in the key's queue
//		owner      text NOT NULL,
//		kind       integer NOT NULL,       -- 1 reader, 2 writer, 3 permit
//		lim        integer NOT NULL,       -- a semaphore's n; 1 for readers and writers
//		token      bigint NOT NULL,        -- head: the key's counter; a holder: its token; a waiter: 0
//		expires_us bigint NOT NULL,        -- the lease of a holder, or the wait of a waiter
//		PRIMARY KEY (family, lock_key, seq)
//	);
//	INSERT INTO "locker_locks_meta" (name, value) VALUES ('families_version', '1') ON CONFLICT (name) DO NOTHING;
//
// DDL returns these statements too. The lock table's layout, and its
// schema_version, are unchanged, so releases without lock families keep
// sharing the tables with this one. A Locker finds the families table by
// its families_version row at its first call (the mutex's waiters queue
// in it too, see "Fairness"); on tables made by an earlier release it
// creates the table then (CREATE TABLE IF NOT EXISTS, which needs the
// CREATE privilege), and with WithoutDDL it fails every family call with
// an error that gives the statements to run (its mutexes work, without
// the queue). A families_version other than 1 is refused, naming it.
//
// The algorithm. Each key of a family is a queue of rows in seq order: a
// row per holder and per waiter, behind the key's head row. A row is
// admitted (holds) when fewer than lim of the rows ahead of it conflict
// with it: for a permit every row ahead conflicts (so the n oldest rows of
// a semaphore hold its n permits), for a writer too (lim 1: nobody ahead),
// for a reader only the writers (the readers ahead of the first writer
// hold together). Every row is queued, and every grant made, in a
// transaction (READ COMMITTED on PostgreSQL and MySQL) that first locks the
// key's head row, takes the next value of the key's counter, max(last + 1,
// the database's now in microseconds), deletes the key's rows whose lease
// has run out (only when it sees one), and counts the rows ahead. So seqs
// follow the order rows were queued in, and tokens the order of grants:
// a queued row's seq, and a grant's token, are counter values. A semaphore
// limit other than the key's rows' is refused (locker.ErrLimitMismatch,
// also to a waiting Acquire) in the same transaction, so a key has one
// limit while it has holders or waiters. (On PostgreSQL the families'
// statements read the clock when they run, clock_timestamp(), not the
// transaction's start, now(): a grant made after a wait for the head lock
// gets its whole lease on the database.) Renewal, Release and the end of a
// wait are one statement each on the holder's own row, guarded by its
// owner (and, for Renewal and Release, its token and unexpired lease), and
// need no head lock; a Release or a given-up wait then reads which waiting
// rows the key admits now and wakes exactly those.
//
// Fencing tokens: one sequence per key and family, readers and writers
// alike: a writer's token is above every earlier reader's and writer's, a
// reader's above every earlier writer's, and every permit's above every
// earlier permit's. Like the mutex's they are about the database's clock in
// microseconds (WithTokenBase applies); they are not comparable with the
// mutex's tokens of the same key, which is another lock.
//
// Fairness: first come, first served across readers and writers (the
// writer is not starved: a reader that comes after a waiting writer waits
// behind it, and TryAcquireRead fails while a writer waits), and among a
// semaphore's waiters; TryAcquire of any family fails with
// locker.ErrNotAcquired when the key does not admit it at once, including
// when others wait first. A waiter that gives up deletes its row, and the
// rows it held back (the readers behind a writer that gave up) are woken.
//
// Waiting. A waiter's row has a lease of its own, three retry intervals
// (at least locker.MinTTL, at most the lock's TTL: 3s by default), which
// the waiter extends whenever it looks at its place; a waiter whose process
// dies, stops or is cut off for longer loses its place (its row lapses and
// the rows behind it move up: a dead waiter holds them back for that long
// at most) and, if it comes back, queues again at the back.
// It takes the head lock only to queue and to take its grant. It is woken:
//
//   - by name, when a release (or an expiry swept up, or a waiter giving
//     up) admits its row: at once in this process; on PostgreSQL, in every
//     process, through the listener (the statement that finds the admitted
//     rows notifies "!owner" on the table's channel);
//   - on SQLite across processes, by the signal file: a process that finds
//     an admitted row of another process writes it, and the head waiter of
//     each key in the other processes wakes, finds the admitted rows and
//     wakes them by name;
//   - on MySQL and MariaDB across processes, by bells, as the mutex's
//     waiters are (see Waiting): each holder of a family rings the bell of
//     its own row (named by the family, the key and the row's seq) once it
//     has held it for 5ms; a waiter whose row waits for a row held in
//     another process (the nearest conflicting row ahead for a reader or a
//     writer, the oldest for a permit) waits in GET_LOCK for that row's
//     bell, which its holder gives back at its release, then looks at its
//     place; a wake by name cuts the wait short. The bell waits take one
//     connection each, at most four per *sql.DB as for the mutex. A
//     semaphore's waiter wakes by the bell of the oldest permit only: a
//     younger permit's release in another process reaches it at its next
//     look;
//   - otherwise (WithNotify(false), a bell that nobody rings, no room for
//     a bell wait): by its look at its place every retry interval, with the
//     back-off (2ms doubling up to it) where nothing wakes it.
//
// In every case it looks no later than the first row ahead of it runs out
// (a crashed holder's permit is taken as soon as its lease ends on the
// database) and at least three times per lease of its own row, to keep it.
//
// Failure modes of the families, beyond the mutex's:
//
//   - A holder that crashes or is cut off: its row frees when its lease
//     ends on the database (a cut holder reports the loss by its own clock
//     first); the next rows are admitted then.
//   - A client that goes silent inside a families transaction holds the
//     key's head lock, and so every acquisition of that key, until the
//     database ends its transaction: on PostgreSQL at most its lease (the
//     head statement sets idle_in_transaction_session_timeout locally); on
//     MySQL and MariaDB when the server drops the session (wait_timeout,
//     MariaDB's idle_transaction_timeout, or TCP keepalive: set one of them
//     if partitions between the clients and the server are a concern;
//     waiters time out in innodb_lock_wait_timeout and try again); on
//     SQLite a process stopped inside one (SIGSTOP, a debugger) holds the
//     database's write lock, and with it every lock of the file, until it
//     runs again. The transactions are a few statements long.
//   - A row changed or deleted from outside: the holder learns at its next
//     renewal (locker.ErrLost), as for the mutex.
//   - An acquisition whose transaction failed or was cancelled after it may
//     have committed deletes its row in the background (guarded by its
//     owner), as the mutex's clean-up does.
//
// Cost: an uncontended acquisition is a transaction of five round trips
// (BEGIN, the head row, the count, the insert, COMMIT; MySQL also sets the
// isolation level first) against the mutex's one statement; a release is
// two statements (the delete, the read of the admitted rows).
//
// # Unsafe configurations
//
// A table of which each connection has its own copy would let every
// process hold every key at once. Such configurations are refused with an
// error wrapping locker.ErrUnsafeConfig that names the option:
//
//   - a table in a temporary schema: SQLite's temp (and an attached
//     database with no file), PostgreSQL's pg_temp, pg_temp_N or
//     pg_toast_temp_N in any case (WithTable, URL parameter lock_table;
//     refused by New and Open, the error also wraps
//     locker.ErrInvalidOption);
//   - on PostgreSQL, an unqualified name that resolves to a temporary
//     table, or that CREATE would make one of (a search_path with pg_temp
//     first and no such table in the later schemas): refused at the first
//     call;
//   - an in-memory SQLite database (refused by Open; on a *sql.DB of one,
//     at the first call, which finds it cannot use WAL mode);
//   - an SQLite connection with synchronous=OFF, with which a crash of the
//     operating system or a power loss can corrupt the file (refused at the
//     first call; see "SQLite").
//
// MySQL has no temporary schema, but a session's TEMPORARY table hides a
// base table of the same name, qualified or not, on that connection only.
// The Locker never creates one; a program that runs CREATE TEMPORARY TABLE
// with the lock table's name on connections of the Locker's pool splits
// the table in two, and no server-side check can see it from another
// connection. Do not.
//
// # TTL
//
// Every TTL of locker's portable range [locker.MinTTL, locker.MaxTTL] (1s
// to 24h) works; without locker.WithTTL a lock has locker.DefaultTTL (30s),
// or the Locker's WithTTL (URL: lock_ttl). The lease is the TTL rounded
// down to a whole microsecond (the unit of the table's expiry), which
// Handle.TTL reports. Inspect reports the remaining lease but not the full
// one (LockInfo.Lease is 0): the row keeps only the expiry.
//
// # Time
//
// Leases are measured on the database's clock only: expires_us is
// microseconds since the Unix epoch by now() on PostgreSQL,
// UTC_TIMESTAMP(6) on MySQL (independent of the session's time zone) and
// unixepoch('subsec') on SQLite (millisecond precision). A client sends
// durations, never times, so clients with skewed clocks still exclude each
// other. The holder measures its own side of the lease on its monotonic
// clock from the moment its last successful acquire or renewal was sent:
// it counts the lock as lost at that moment + TTL − drift margin, even
// while a renewal hangs, and the database cannot let anyone else in before
// that moment + TTL. (SQLite's clock is the host's: processes sharing one
// file share one clock anyway.)
//
// So the database's clock must not jump. A jump forward shortens every
// lease it passes over: acquirers see those leases over at once, while
// their holders still count them as theirs until their own deadlines (a
// loss they learn at their next renewal); until then only the fencing
// tokens keep their writes apart. A jump back lengthens leases of crashed
// holders by as much (a released row is free whatever its expiry says).
//
// # Statements
//
// Acquire is one statement, one round trip. PostgreSQL and SQLite:
//
//	INSERT INTO t AS l (lock_key, owner, token, expires_us) VALUES ($key, $owner, NOW_US, NOW_US + $ttl)
//	ON CONFLICT (lock_key) DO UPDATE
//	SET owner = excluded.owner, token = GREATEST(l.token + 1, excluded.token), expires_us = excluded.expires_us
//	WHERE l.expires_us <= excluded.token   -- the lease has run out (excluded.token is NOW_US)
//	   OR l.owner = ''                     -- or the row was released
//	RETURNING l.token
//
// MySQL has no RETURNING and no WHERE on ON DUPLICATE KEY UPDATE, and
// evaluates the assignments left to right, each seeing the columns already
// assigned. So owner is assigned first, and changes only if the lease has
// run out or the row was released; after it, owner = VALUES(owner) holds exactly when this statement
// took the key (owners are random and never reused), and token and expiry
// follow it; LAST_INSERT_ID(token) hands the new token back in the reply:
//
//	INSERT INTO t VALUES (?, ?, LAST_INSERT_ID(NOW_US), NOW_US + ?)
//	ON DUPLICATE KEY UPDATE
//	owner = IF(expires_us <= NOW_US OR owner = '', VALUES(owner), owner),
//	token = IF(owner = VALUES(owner), LAST_INSERT_ID(GREATEST(token + 1, VALUES(token))), token),
//	expires_us = IF(owner = VALUES(owner), VALUES(expires_us), expires_us)
//
// 1 or 2 rows affected means taken, 0 means held: so the connection must
// report changed rows, the driver's default (a Locker refuses a DSN with
// clientFoundRows=true). A try that finds the key held makes no new row
// version on any dialect: InnoDB skips a row whose values do not change,
// SQLite's upsert does not update, and PostgreSQL's ON CONFLICT ... WHERE
// false updates nothing, but it is not free there: ON CONFLICT DO UPDATE
// locks the conflicting row even when its WHERE is false, which marks the
// row's header on its page (and logs the lock in the WAL) and queues the try
// behind other writers of the row. Waiters do not rewrite the row; on
// PostgreSQL each failed try costs a row lock, which is why waiters wait
// for a wake-up instead of polling (see "Waiting").
//
// Renewal (every TTL/3 by a watchdog, internal/lease) and Release are
// guarded by key, owner and token and by the lease not having run out on the
// database; zero rows means the lock is gone: the renewal reports the loss,
// and Release returns an error wrapping locker.ErrLost. Release sets owner
// to the empty string and expires_us to the database's now (NOW_US), the
// row's last use, which Prune goes by. A row changed or deleted from
// outside (an operator expiring it, a restore) is therefore noticed at the
// next renewal, within TTL/3 plus a round trip.
//
// The renewals of a Locker's locks that come due within a moment go out
// together (internal/lease.Batcher, as on Redis): one UPDATE per batch of
// up to 128 locks of one TTL and one table, naming each row by key, owner
// and token. When it renews fewer rows than it names (a lock no longer
// ours, a row locked by another transaction: PostgreSQL skips it with FOR
// UPDATE SKIP LOCKED, MySQL and MariaDB wait for it a second at most),
// the locks it did not renew (on MySQL and MariaDB, whose UPDATE cannot
// say which, every lock of the batch) renew on their own, so one lock's
// fate is never another's. 10,000 locks held cost a few statements a second instead of
// one per lock per TTL/3 (BENCHMARKS.md, "Renewals in batches").
//
// Locker.Inspect (locker.Inspector) reads a key's row: held, with token
// and remaining lease, while the lease has not run out by the database's
// clock.
//
// # Fencing tokens
//
// The source is the row's token column with the database clock as a floor:
// each acquisition sets token = max(previous token + 1, database time in
// microseconds). So tokens strictly increase per key across holders, and
// they are large numbers (about 1.8e15 in 2026) that fit an int64 and a JSON
// number. Prune(ctx, olderThan), olderThan at least MinPruneAge (a
// minute), deletes only rows whose lease ran out, or that were released,
// more than olderThan ago by the database's clock (a release records the
// database's time in expires_us, so a row released a moment ago stays) and
// whose token is below the database's now minus olderThan:
//
//	DELETE FROM t WHERE expires_us < NOW_US - $olderThan AND token < NOW_US - $olderThan
//
// (in batches of at most 1000 rows, each its own transaction that locks
// only the rows it deletes: on PostgreSQL rows that an acquire has locked
// are skipped; on MySQL a read that locks nothing picks the keys, then a
// DELETE by key checks the condition again).
//
// When a pruned key is taken again its first token is the database's now
// in microseconds, more than olderThan above the deleted row's last token —
// unless the database's clock was set back by more than olderThan since,
// the one assumption the tokens rest on (it is NTP's job to slew, not
// step, a clock).
//
// WithTokenBase(n) (token_base=n) adds n to every token the Locker hands
// out and Inspect reports; the row and Prune keep the row's own token (see
// locker.MaxTokenBase). The row's token is the database clock in
// microseconds, or a little above it, so it reaches 2^62 only in the year
// 148,000, and n + token, with n at most 2^62, fits an int64; a row beyond
// that (written by hand) makes the acquisition fail with an error naming
// token_base, the row given back.
//
// # Fairness
//
// The mutex serves its waiters first come, first served, across Lockers
// and processes: a waiter queues a row in the families table (family 3:
// the key, a seq from the key's queue, a random owner, a lease of its own),
// and the acquire statement takes a free or expired row only when no row
// of the key's queue whose lease has not run out is ahead of the caller:
//
//	... ON CONFLICT (lock_key) DO UPDATE SET ...
//	WHERE (l.expires_us <= NOW_US OR l.owner = '')
//	  AND NOT EXISTS (SELECT 1 FROM t_fam w WHERE w.family = 3 AND w.lock_key = $key
//	                  AND w.seq < $seq AND w.expires_us > NOW_US)
//
// (MySQL: the same condition in the IF that assigns owner.) A caller that
// has not queued (the first try of Acquire, every TryAcquire) has no seq:
// every live waiter is ahead of it. So a client that releases and asks
// again at once queues behind the waiters instead of taking the key
// straight back, and a TryAcquire of a free key fails with
// locker.ErrNotAcquired while others wait for it, as with the lock
// families: it never waits, and it does not overtake them. The queue
// orders who may take a free row; mutual exclusion and the tokens stay
// the lock row's alone, so a waiter that queued a moment late, or a
// process of an earlier release (which does not look at the queue),
// costs fairness, never safety.
//
// The seq is the last one of the key's queue plus one (on PostgreSQL and
// MySQL at least the database's now in microseconds; two waiters that
// take the same seq at once: the second takes the next). A waiter's row
// has the lease of the families' waiters (three retry intervals, at least
// locker.MinTTL, at most the lock's TTL: 3s by default), which it extends
// every third of it while it waits; a waiter that dies or stops holds the
// queue back until its row's lease runs out, and one that comes back
// after that queues again at the back. The waiters behind a lapsing row
// sleep until it runs out (they read when, with the holder's remaining
// lease). Within a process the waiters of a key are woken in their queue
// order. A holder deletes its waiter row right after its grant, off the
// caller's path (its Release waits for that delete before it frees the
// lock); a waiter that gives up deletes its row, bounded by
// the Locker's own deadline rather than the caller's ended context, and
// wakes the next waiter of its process.
//
// Cost: nothing changes for an uncontended acquisition but the NOT EXISTS
// probe of the families table's primary key: no measurable change on
// SQLite and PostgreSQL, about a fifth more on MariaDB, where the probe is
// a locking read (BENCHMARKS.md). A contended one adds the queue's insert,
// a read of its place and the delete of its row (off the holder's path),
// and hands the lock from one client to the next on every release, where
// an unfair lock lets its releasing client take it straight back: at 8
// and 64 clients on one key, min/max share 0.82 to 0.98 against 0.06 to
// 0.89 before, at a throughput that BENCHMARKS.md gives per dialect. A
// caller that finds waiters of its own process queued for the key queues
// at once, without the try that would fail.
//
// Without a families table (tables of an earlier release with
// WithoutDDL, or a role that may not create it), or with a role that has
// no rights on it (SELECT, INSERT, UPDATE and DELETE; checked at the first
// call), the mutex works as before, unqueued: whoever tries first after a
// release takes the key.
//
// # Waiting
//
// Acquire tries once; when the key is held it waits for a wake-up, then
// tries again, until it holds the key or ctx ends:
//
//   - In-process: a release by any Locker of the process on the same table
//     of the same database, whatever its *sql.DB, wakes that key's
//     longest-waiting waiter at once, on every dialect. The database is
//     told by what it says of itself when a Locker first uses it (SQLite:
//     the file; PostgreSQL: the server's address, port and start time and
//     the database; MySQL: the server's host name and port; with the
//     table's qualified name), or by the *sql.DB when it cannot say. One
//     waiter, not all: the others would only fail their tries; a waiter
//     that leaves without the lock (its context ended, a statement failed)
//     before acting on a wake-up passes it on.
//   - PostgreSQL: each release notifies the table's channel (pg_notify with
//     the released owner and the key, in the release statement), and each
//     Locker keeps one connection listening (LISTEN) from its first wait
//     until Close: a pgx connection of its own, opened with the settings
//     of one of the pool's, outside database/sql (a statement waiting
//     there for hours would make the RowsAffected of that pooled
//     connection's previous user wait as long), so that the server sees
//     one connection more than the pool's limit; in every process the
//     longest-waiting waiter of the key wakes within a round trip (a
//     release heard twice, from its own process and from a listener,
//     wakes one). The listener is off with
//     WithNotify(false), and while the pool is limited to fewer than four
//     connections, which it would starve. The limit is read when the
//     listener takes its connection, and again before every lock statement
//     and every 200ms while it keeps it: a pool whose limit drops below
//     four after New (SetMaxOpenConns) has the listening connection closed
//     at once, and waiters poll until the limit allows a listener again
//     (the limit stands for the program's budget of server connections,
//     which the listener would overrun). Several Lockers on one *sql.DB
//     each keep a listening connection: count one server connection per
//     Locker on top of the pool's limit against max_connections (or share
//     one Locker; a listener shared per *sql.DB is not built yet).
//   - SQLite, across processes: each release writes one byte to a signal
//     file beside the database, "<database file>-locker" (created with the
//     database file's permissions and left in place, like the database),
//     and every process whose Lockers wait watches it (fsnotify: inotify
//     on Linux, kqueue on macOS and the BSDs), from its first wait until
//     its last Locker on the file closes. A write wakes the process's
//     longest waiter of every waited key of the file's tables (the byte
//     does not say which key was freed; those whose key is still held try
//     once and go back to sleep, so a release costs a try per waited key
//     and watching process). Every Locker writes the signal;
//     WithNotify(false) only keeps its own waiters from watching. A
//     process that cannot create or write the file does not signal, so
//     the waiters of other processes learn of its releases only at their
//     retry interval; one that cannot watch it, and every process on
//     Windows (where a file kept open reports only its first write),
//     waits with the back-off below. A removed or replaced signal file is
//     followed: a watching process creates (or opens) it again at once and
//     watches it again, any other process at its next release.
//   - MySQL and MariaDB, across processes: neither can notify a client, but
//     both have named locks (GET_LOCK), which a waiting session gets the
//     moment their holder gives them back. So a holder takes its key's
//     named lock, its "bell" ("locker:" and a hash of the database, the
//     table and the key), on a connection of its Locker's own 5ms after the
//     grant, and gives it back right after the release (or the loss; a
//     closed session frees its named locks on the server). The longest
//     waiter of the key in a process where nobody holds it, instead of
//     sleeping, waits in GET_LOCK for the bell (at most as long as it would
//     sleep), gives it back at once (so that the waiters of other processes
//     get it in turn) and tries the key. A bell nobody rang comes at once
//     (a hold under 5ms, a holder of an older release of this package or
//     without a bell, one whose bell connection failed, a dead holder's
//     lease): the waiter then sleeps its back-off, which keeps growing
//     while that lasts, so such a key is polled as before, plus two
//     statements per round. Each Locker keeps one connection of the pool
//     for its bells from the first key it has held for 5ms until Close,
//     and waits take one connection each, at most four per *sql.DB (a
//     quarter of a limited pool). Like the PostgreSQL listener, the bell
//     is off with WithNotify(false) and while the pool is limited to fewer
//     than four connections (read when a connection is taken, and given
//     back when the limit drops, as for the PostgreSQL listener), and the
//     check is per Locker: give a pool shared by several Lockers one
//     connection per Locker on top of what the locks use. MariaDB takes
//     fractional GET_LOCK timeouts; MySQL takes whole seconds, so there a
//     waiter waits for the bell only when it would sleep a second or more
//     (the default retry interval is one). Several
//     named locks per session need MySQL 5.7 or MariaDB 10.0.2. Tested on
//     MariaDB only.
//   - Otherwise (PostgreSQL and SQLite while the listener or the watch is
//     down or with WithNotify(false), MySQL without the bell or while the
//     bell waits are all taken, SQLite on Windows): a jittered exponential
//     back-off from 2ms up to the retry interval (WithRetryInterval,
//     default 1s).
//
// In every case a waiter sleeps no longer than the holder's remaining
// lease, read from the row by the database's clock, so a crashed holder's
// key is taken as soon as its lease runs out; with notifications the retry
// interval is only the safety net for a lost one (a release by a process
// running an older release of this package, say). So the handoff is one
// round trip after the release within a process, on PostgreSQL and on
// SQLite (not on Windows), a few round trips across processes on MySQL for
// holds of 5ms or more, and up to the back-off across processes on MySQL
// for shorter holds and on SQLite under Windows (see BENCHMARKS.md for
// measured handoffs, within and across processes).
//
// # Cost
//
// The lock statements are prepared once per Locker (database/sql prepares
// them on each connection it uses): one round trip each, also on MySQL.
// Every statement carries a context that the Locker's Close can cancel,
// even when the caller's cannot be, so the drivers watch it (a goroutine
// hand-off per statement): on a loaded machine that is most of the
// difference to hand-written statements run with context.Background(), and
// none of it against the same statements run with a cancellable context
// (BENCHMARKS.md).
//
// # SQLite
//
// A Locker puts the database into WAL mode (readers and the writer do not
// block each other; the mode is recorded in the file, so this is done once
// for every connection and process). Every statement is one implicit
// transaction, so no BEGIN IMMEDIATE is needed; every statement that finds
// the database busy or locked ("database is locked") beyond the
// connection's busy timeout is retried within the caller's context. Several
// processes on one file exclude each other; the file must be on a local
// file system (SQLite's locks do not work over most network file systems),
// and an in-memory database is refused, as it cannot be shared.
//
// The connection settings are checked at the first call, which fails,
// naming the setting and the DSN that sets it right, rather than let a
// Locker run slow or unsafe:
//
//   - synchronous must be NORMAL. It is a setting of each connection, not
//     of the file, and the Locker cannot set it on the pool it was given:
//     a PRAGMA would change one connection of the caller's pool (and the
//     caller's own statements on it), not the others nor those the pool
//     opens later. Only the DSN sets it on every connection, so the
//     Locker refuses, rather than fixes, any other value: FULL (SQLite's
//     default, so a plain sql.Open("sqlite", path)) and EXTRA flush the
//     WAL to disk at every commit, which made every lock operation 4.6
//     times as slow as the URL's (733µs against 158µs p50; 4.8 to 6.1
//     times interleaved with it on the test machine) and buy the lock
//     table nothing: a power loss or a crash of the operating system,
//     which under NORMAL may undo the last commits, also ends every
//     process that could hold a lock in the file (SQLite's locks are of
//     one host), so an undone grant has no holder left; an undone release
//     leaves a row held until its lease runs out, as a crashed holder's;
//     and the tokens issued afterwards still rise, as each starts from the
//     database's clock. OFF is refused as unsafe: it does not flush the
//     WAL even at checkpoints, so such a crash can corrupt the file. A
//     program that wants FULL for its own tables in the same file opens a
//     second pool for the Locker: connections with different settings
//     share a file.
//   - The busy timeout is not checked: any value works. With 0 (the
//     default) a statement that finds another writer returns SQLITE_BUSY
//     at once and the Locker retries it with its back-off (1 to 50ms);
//     with a longer one SQLite waits itself, and a cancelled context
//     interrupts that wait (modernc.org/sqlite interrupts the statement),
//     so a long timeout does not hold up a cancelled call.
//
// Open, and sqlite.DSN of sqltable/sqlite for New, set WAL, synchronous
// NORMAL and a busy timeout of 50ms on every connection:
//
//	/var/lib/app/locks.db?_pragma=busy_timeout(50)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)
//
// The settings are read on one connection of the pool; one that a program
// changed on some connections only (PRAGMA on a connection of its own) can
// escape the check.
//
// # Failure modes
//
//   - The database is unreachable: Acquire and TryAcquire return its error
//     (never locker.ErrNotAcquired); renewals are retried until the lease's
//     deadline, then the holder is told of the loss. Release that cannot
//     reach the database gives the lock up anyway, says so, and frees the
//     row in the background if the database comes back within min(TTL, 5s)
//     and the Locker is not closed meanwhile; else the lease ends it.
//   - The database restarts: held rows survive (they are in a table); a
//     holder keeps its lock if a renewal succeeds before its deadline.
//   - A row is changed or deleted from outside: the holder learns at its
//     next renewal (within TTL/3) and ends with locker.ErrLost; its Release
//     never frees a row it no longer owns.
//   - A pool of one connection (SetMaxOpenConns(1), also set after New):
//     statements queue for the connection, nothing pins it, no listener or
//     bell takes it (one that had it gives it back); a renewal that
//     cannot get the connection before its deadline is a loss, never a
//     deadlock.
//   - Acquisitions stuck on the server (a key's row, or a families key's
//     head row, kept locked by another transaction: an operator's SELECT
//     ... FOR UPDATE, a client gone silent inside a transaction) hold
//     their connections while they wait. The Lockers on one *sql.DB let
//     their acquisitions (and background clean-ups) take at most the
//     pool's limit less the connections their bells keep (MySQL) less one
//     at once; a further one, TryAcquire's too, waits for its turn within
//     its context (first come, first served), and a bell is not rung while it would take the last
//     connection. The connection left serves the held locks' renewals, the
//     releases and the waiters' short statements, so a stuck key does not
//     cost a Locker its other locks. A pool without a limit needs no
//     share; one too small for it lets one acquisition through at a time.
//     Not covered: a renewal or a release of a lock whose own row is kept
//     locked waits too, on its connection (a batch of renewals does not:
//     see renewMany), and several such can take what is left; nor are the
//     application's own statements on a shared *sql.DB counted: where they
//     may hold every connection, give the Locker a pool of its own (Open
//     does).
//   - An Acquire whose statement failed or was cancelled after it may have
//     reached the database frees the row in the background (guarded by the
//     attempt's own owner) if it took it. On PostgreSQL and MySQL the
//     cancelled statement may still run on the server (cancellation is
//     asynchronous: an upsert waiting for a lock can commit after its
//     caller gave up), so the guarded drop is repeated, with a pause growing
//     from 10ms to 1s, until it frees the row or min(TTL, 5s) has passed;
//     on SQLite the statement is over when its call returns and one drop
//     does. Close stops the repeats; a row taken after them (a statement
//     held up longer on the server) frees at the end of its lease.
//   - The acquire statement's answer comes back with less than a tenth of
//     the lease left (the lease runs from the moment it was sent, less the
//     drift margin: a slow database or network): the grant is given back
//     (guarded by the attempt's owner) instead of handing out a Handle that
//     is lost at once or already. Acquire tries again within ctx;
//     TryAcquire tries up to three times, then fails with an error saying
//     how long the grant took (never locker.ErrNotAcquired).
//   - Close begins while an Acquire is taking its lock: the Acquire returns
//     an error wrapping locker.ErrClosed, never a Handle, and Close
//     releases the row (once).
//   - Another writer holds SQLite's write lock: statements wait for it
//     within the caller's context (TryAcquire too: a busy database is not a
//     held key); they never fail with "database is locked".
//   - Close releases held locks (each with its own guarded statement),
//     waits for Releases already in flight, all within
//     locker.ReleaseTimeout from its start, after which it cancels their
//     statements (such a Release returns an error wrapping
//     locker.ErrClosed; its lock frees at the end of its lease); it ends
//     waits with locker.ErrClosed, stops background clean-ups, the
//     listener and every goroutine, waiting for them at most
//     locker.ReleaseTimeout more, and closes the *sql.DB only if Open
//     made it.
//
// # Drivers and imports
//
// The package imports no database driver: each dialect is in a driver
// package that registers it when imported, as database/sql drivers do, so
// that a program links only the driver it uses (a one-line program on
// postgres+table:// links pgx alone: 14 MB, against 21 MB when the package
// linked the three):
//
//   - github.com/go-locker/locker/sqltable/pgx: PostgreSQL, through
//     github.com/jackc/pgx/v5/stdlib; the postgres+table:// and
//     postgresql+table:// schemes;
//   - github.com/go-locker/locker/sqltable/mysql: MySQL and MariaDB,
//     through github.com/go-sql-driver/mysql; the mysql:// scheme;
//   - github.com/go-locker/locker/sqltable/sqlite: SQLite, through
//     modernc.org/sqlite, and github.com/fsnotify/fsnotify, which watches
//     SQLite's signal file; the sqlite: scheme; and DSN.
//
// Each links its driver and nothing else beyond this package. A URL whose
// driver package was not imported fails with an error wrapping
// locker.ErrUnknownScheme that names the package to import ("forgotten
// import?"), as does New (wrapping locker.ErrInvalidOption) on a *sql.DB
// of such a driver, or with WithDialect of such a dialect. New on a
// wrapped driver (instrumentation) takes WithDialect and the dialect's
// driver package; on PostgreSQL it then acquires through database/sql and
// its waiters poll, as it cannot reach pgx below the wrapper. The locker
// command imports all three.
//
// # At risk and logging
//
// A Handle is a locker.AtRisker: at risk from a renewal that failed, or has
// not answered within its retry interval (a twentieth of the TTL), until one
// succeeds. WithLogger logs the renewal failures, the lock at risk and
// cleared, its loss and why, the LISTEN connection replaced, and (at Debug)
// a statement run again after its pooled connection was found gone; nothing
// without it.
package sqltable
