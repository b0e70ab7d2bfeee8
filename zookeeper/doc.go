// Package zookeeper is the ZooKeeper backend of locker: the lock recipe of
// the ZooKeeper documentation and Curator's InterProcessMutex (and, for
// reader-writer locks and semaphores, InterProcessReadWriteLock and a fair
// semaphore: see "Reader-writer locks and semaphores"), with
// ephemeral sequential nodes, the lowest holding, each waiter watching the
// node before its own (and the one before that: see "The recipe"),
// GUID-protected names, fencing tokens from the
// holder's czxid, and a loss report that takes the session timeout
// seriously. It runs on go-zookeeper (github.com/go-zookeeper/zk).
//
//	l, err := zookeeper.Connect(ctx, []string{"zk1:2181", "zk2:2181", "zk3:2181"})
//	...
//	defer l.Close()
//	h, err := l.Acquire(ctx, "invoice/42", locker.WithTTL(5*time.Second))
//	...
//	defer h.Release(ctx)
//
// # What it promises
//
// While no fault occurs, at most one holder has a key, across goroutines,
// Lockers and processes that use the same ensemble and root. Waiters get
// the key in the order they asked (fair). A release wakes two live
// waiters at most, however long the queue: the next holder, which usually
// takes the key with no further request, and the waiter after it (see
// "The recipe").
// Every acquisition returns a fencing token larger than that of every
// earlier holder of the key. A holder learns that its lock is lost (Done is
// closed, Err wraps locker.ErrLost) before the server can give the key to
// anyone else, as long as clocks run at about the same rate (see "Failure
// modes"). Release deletes only the holder's own node.
//
// # Leases: one session per TTL
//
// A ZooKeeper lock has no lease of its own: it lives as long as its node,
// an ephemeral node, which lives as long as the session that created it.
// The client keeps the session alive with pings (every third of its
// timeout) as long as it reaches a server; a holder that dies or is cut
// off blocks others until the server expires its session, one session
// timeout after it last heard from it. So a lock's lease is the timeout
// of the session that owns its node, and a Locker has one session per
// lease in use, each on a connection of its own:
//
//   - locker.WithTTL(ttl) (else the default TTL: locker.DefaultTTL, or
//     WithDefaultTTL, URL parameter ttl) is rounded down to a lease step:
//     1, 1.5, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 30, 40 and 50 seconds, the
//     same in minutes, then 1, 1.5, 2, 3, 4, 5, 6, 8, 10, 12, 15 and 20
//     hours, and 24h. That is 43 steps, each at most a third below the
//     next, and every round TTL (1s, 5s, 30s, 1m, 5m, 1h, 24h) is a step
//     of its own. Rounding down is the rule of the TTL contract
//     (locker.MinTTL): a shorter lease is safe for exclusion.
//   - The lock goes into the Locker's session of that lease, dialed at the
//     first Acquire that needs it and shared by every lock of the lease.
//   - The server grants a session timeout between its minSessionTimeout
//     and maxSessionTimeout (by default 2 and 20 ticks, 4s and 40s with
//     the usual tickTime of 2s): a TTL beyond them gets the floor or the
//     ceiling. Once a grant has shown the floor or the ceiling, every
//     lease beyond it goes to that session, with no session dialed for
//     it: on a server with default settings a Locker so has at most about
//     ten sessions (4s up to 40s), whatever TTLs it is asked for.
//   - Handle.TTL reports the lease given: the timeout the server granted
//     the lock's session, as it was when the lock was taken.
//   - The primary session, the default TTL's (Connect waits for it), stays
//     open for the Locker's life; another is closed once no lock of it is
//     held and no Acquire has used it for 10 to 20 seconds, and on
//     Close. A Locker that holds no lock so keeps no session but the
//     primary one.
//
// Everything below (loss deadlines, lease checks, watches, the clean-up
// of nodes given up, reconnects) is per session, for every session. An
// expiry ends the locks of its session, not those of the Locker's other
// sessions.
//
// # Connection and session events: Connect or New
//
// The lease is the session, so the Locker must see every session event
// (disconnected, reconnected, expired), and go-zookeeper delivers those
// only on the channel zk.Connect returns or to a zk.WithEventCallback
// given to zk.Connect. Hence two constructors:
//
//   - Connect dials its sessions itself, and owns them: Close closes them.
//     It registers an event callback on each (no event is ever dropped),
//     and dials through a thin wrapper that tells it when bytes last came
//     from the server and which session timeout the server granted
//     (go-zookeeper exposes neither), so that a disconnected lock is given
//     up at the latest safe moment, not earlier. Use it unless you must
//     share a connection.
//   - New uses a connection you made with zk.Connect and keep using (Close
//     leaves it open) as its primary session. It reads what the connection
//     shows (its session, its state, the server it is on) and checks what
//     it must be told: the events channel must be the one zk.Connect
//     returned with that connection (the Locker becomes its only reader; a
//     program that wants the events too registers zk.WithEventCallback,
//     which sees them independently), and WithSessionTimeout, the timeout
//     you gave zk.Connect, must be what the server grants for it (New asks
//     the server with a short session of its own). A channel that is nil,
//     another connection's, or read by another open Locker, or a timeout
//     the server does not grant as is, fails every call with an error that
//     says so. A timeout the server grants as is but that is not the one
//     you gave zk.Connect cannot be told apart: give the same. Without the
//     view below go-zookeeper, New assumes the server was last heard from
//     two thirds of a session timeout before the disconnect (go-zookeeper's
//     receive timeout), so a disconnected lock is given up sooner than
//     with Connect. Your session serves every TTL at or above its timeout
//     up to the next lease step; for the other leases New dials sessions
//     of its own (as Connect does, closed when idle and on Close) at the
//     servers named by WithServers. Without WithServers it dials none: a
//     TTL above your session's timeout gets that timeout (a shorter lease,
//     reported by Handle.TTL), and a shorter TTL is refused with an error
//     wrapping locker.ErrInvalidOption that names WithServers (a longer
//     lease than asked is never given).
//
// One Locker serves any number of goroutines and keys; the locks of one
// lease share its session.
//
// # How it works
//
// A key's lock directory is <root>/<EncodeKey(key)>, default root
// "/locker". EncodeKey is "k" followed by the key with '%', '/' and the
// characters ZooKeeper refuses in paths percent-escaped: one path
// component, never ".", ".." or "zookeeper", distinct for distinct keys.
// Acquire creates an ephemeral sequential node
// <dir>/_c_<GUID>-lock-<sequence>. The lowest sequence holds. The create
// goes out in a multi (one transaction) together with an empty,
// unconditional write to the directory's data, whose answer is the
// directory's stat just after the create: when the directory holds
// nothing but the new node, the lock is taken with that one request, as
// cheap as a bare create (this needs WRITE on the directory; with an ACL
// without it, the Locker uses plain creates from the first refusal on).
// Otherwise the contender lists the directory and watches the node just
// before its own and, when there is one, the node before that (GetW, which
// leaves no watch behind on a node already gone); when only one node is
// before its own, it also watches its own node (the requests back to
// back). Since nodes created later always get higher sequences, the nodes
// before a contender's can only go: when the watched one goes and it was
// the only one before, the lock is taken with no further request (events
// arrive in transaction order, so a deletion of the contender's own node
// would have been seen first; a waiter whose request fails with the
// connection sets its watches again, and a new connection makes later
// waiters set new ones, since go-zookeeper re-arms the old ones in no
// particular order; a waiter that hears of its predecessor's deletion on
// a connection other than the one its watches were set on lists the
// directory before it takes the lock, as its own node's deletion may come
// second. On a session it dialed the Locker counts connections on
// go-zookeeper's goroutine, before the old watches are re-armed; on New's
// own session it counts them as it reads the events from your channel, which could in principle lag behind a
// re-armed watch firing). When the
// node two before goes, the one just before most likely holds the lock
// now, and the contender lists again at once, while that holder holds: its
// own turn then needs no request (when that hold outlasts the listing's
// round trip), where go-zookeeper's Lock and Curator list on every wake-up.
// So each node has two live waiters watching it at most, and a release
// wakes two waiters, not the queue. The waiters of one Locker share their
// watches on other contenders' nodes: go-zookeeper cannot remove a watch,
// so a waiter that gives up leaves its watch set until the node changes,
// and an Acquire with a timeout tried again and again while one holder
// keeps the key would otherwise pile one up per attempt.
// When the node just before goes with others still listed before it (it
// gave up waiting), the contender lists again.
//
// A holder watches its own node, to learn of a deletion from outside. A
// lock whose contention did not set that watch (no contention, or a
// listing that found the contender first) sets it 50ms after the
// acquisition, so that a lock released sooner never costs the request; a
// deletion in those first 50ms is reported when the watch is set. The
// events of those watches reach the session's supervisor, routed by path:
// a held lock costs no goroutine, so a Locker holding 10,000 locks runs as
// many goroutines as one holding ten. On a session the Locker dialed
// (Connect, and New's sessions for other TTLs) the connection's event
// callback routes them; on your connection (New) the supervisor reads them
// from your events channel, and since go-zookeeper drops events from that
// channel when it is full, it also looks at the watches' own channels every
// second: a deletion whose event was dropped is reported within a second.
//
// go-zookeeper v1.0.4 has a data race that the race detector reports when
// a connection comes back with watches set while a reply arrives (the
// field lastZxid; go-zookeeper/zk pull request #35): harmless, but a
// program tested with -race may see it. The integration tests run a copy
// with that field made atomic (integration/third_party/zk).
//
// Directories (the root and each lock directory) are container nodes
// (ZooKeeper 3.5.3 and later), which the server deletes once they are
// empty, so lock directories do not pile up. A create that finds its
// directory gone (container cleanup) makes it again and retries. On a
// server without containers the Locker falls back to persistent
// directories by itself (or use WithoutContainers); empty ones then stay
// until someone deletes them, which is safe at any time.
//
// The GUID protects against lost answers: when the connection breaks
// after a create was sent, the Locker lists the directory after the
// reconnect and adopts the node carrying its GUID, instead of creating a
// second one and leaving a ghost that would block every waiter behind it
// until the session ended. A create whose caller stopped waiting (its
// context ended) and that the server applied all the same is deleted when
// its answer arrives.
//
// TryAcquire creates its node, checks whether it is the lowest, and
// deletes it when it is not. An Acquire whose context ends deletes its node
// before it returns, with a cleanup deadline of its own (up to 2s) rather
// than the caller's ended context; if the server does not answer in that
// time the deletion goes on in the background and is repeated after a
// reconnect in the same session (otherwise the node ends with the
// session).
//
// # Reader-writer locks and semaphores
//
// The Locker implements locker.ReadWriter and locker.Semaphorer with the
// recipes of Curator's InterProcessReadWriteLock and a fair semaphore, on
// the mutex's machinery: the same GUID-protected ephemeral sequential
// nodes made by the same create (one request when the directory is
// empty), the session of the lock's TTL, the Handle with its loss
// reports, Release and Close. Each family has a keyspace of its own: the
// mutex "k", the reader-writer lock "k" and the semaphore "k" are three
// locks, in three directories, LockDir's <root>/k<escaped key>,
// ReadWriteDir's <root>/r<escaped key> and SemaphoreDir's
// <root>/s<escaped key>. A node's name says its kind: _c_<GUID>-read-,
// -write- or -sem-<n>-, then the sequence.
//
//   - A writer waits for every node before its own, exactly as a mutex's
//     node does (the same code): it watches its predecessor and the node
//     before that, except that behind two readers it watches the
//     predecessor only (a reader waits for no reader, so the other one
//     going says nothing of the predecessor's turn).
//   - A reader waits only for the write nodes before its own: the same
//     queue over those, watching the nearest writer before it (and its
//     own node when that is the only one), never the writer before that.
//     The readers between two writers all watch the first and get in
//     together when it goes; nobody behind the second hears of it.
//   - A permit of a semaphore of n is held by each of the n lowest nodes.
//     Nodes before ours only go, so a node among the n lowest stays there
//     until it goes. Holders leave in any order, so the first waiter (the
//     (n+1)-th node) watches all n holders, and gets in when any goes. A
//     waiter further back cannot get in before its predecessor does, and
//     becomes the first waiter when its predecessor gets in or goes, so it
//     watches its predecessor only: for its deletion, and for the write
//     to its data that a node that got in makes when its listing shows
//     nodes after its own (any of which may have taken it for a waiter).
//     A freed permit so wakes one waiter, which wakes the next one with
//     that write (the relay: one write more per handoff than the mutex,
//     made in the background, off the new holder's way, and repeated
//     through disconnections until it is applied or the node is gone,
//     whose deletion wakes the next waiter too); nobody else hears of it.
//     The relay needs WRITE on the nodes: a semaphore under an ACL that
//     grants it to nobody is refused (locker.ErrInvalidOption), and a
//     permit whose write is refused all the same is given up, lost, its
//     node deleted. The first waiter sets n watches each time
//     the role passes to it: cheap for the small n semaphores are used
//     with, a cost to weigh for n in the hundreds.
//   - The limit n is in every permit's name, so the listing that every
//     waiting permit makes shows the limit of each holder and waiter. An
//     acquisition whose n differs from that of any node before its own
//     fails with an error wrapping locker.ErrLimitMismatch (waiting or
//     not) and deletes its node: the first limit in the queue is the
//     key's, and a second one is never obeyed. (A node of another limit on
//     its way out, refused itself, can get an acquisition that lists the
//     directory in that moment refused too.)
//
// Fairness: first come, first served across readers and writers, and
// across a semaphore's waiters: the order of their nodes. TryAcquireRead
// fails while a writer holds the key or waits for it; TryAcquireWrite and
// TryAcquireSemaphore fail while the key is taken, or others wait first.
// Tokens: the czxid of the holder's node, as for the mutex: one sequence
// per directory across readers and writers, and across a semaphore's
// permits (a writer's node comes after every node that got in before it;
// a reader's after every writer's before it; permits get in in the order
// of their nodes, so a permit's token is above that of every permit that
// got in before it — though of two waiters let in by one change, the one
// with the later node may learn of it first). Failure modes are the mutex's: a
// lost session, a cut, a node deleted from outside end the Handle with
// locker.ErrLost; a waiter whose node goes (its session expired, an
// operator) queues again at the back; the waiter that watched that node
// is woken and moves up. Inspect reports the mutex only.
//
// # Fencing tokens
//
// Handle.Token is the czxid of the holder's node: the id of the
// transaction that created it (read from the create's multi, whose
// directory write carries the same transaction id, or from the node's
// stat). Zxids are assigned by the leader in one
// total order, increase across leader elections (the epoch is the high 32
// bits) and survive restarts with the data directory. Tokens increase per
// key across holders: a contender holds only when its node is the lowest in
// the directory, and every earlier holder's node was created before it (an
// older node with a lower sequence still present would make it wait, and a
// node in an earlier incarnation of the directory was created before the
// directory was deleted, hence before this node). So the later holder's
// node was created later, in a later transaction. Sequence numbers alone
// would not do: they restart at zero when the container directory is
// deleted and made again.
//
// WithTokenBase(n) (token_base=n) adds n to every token the Locker hands
// out and Inspect reports (see locker.MaxTokenBase). A zxid is the leader
// epoch times 2^32 plus a counter, so it reaches 2^62 only after 2^30
// leader elections, and n + zxid, with n at most 2^62, fits an int64.
//
// # The granted session timeout
//
// The server grants a session timeout between its minSessionTimeout and
// maxSessionTimeout, which may be far from the one asked for. A session
// the Locker dialed works with the granted one from the moment it is
// established: its loss deadlines, its checks that requests are still
// answered, the wait of a TryAcquire for a session and the bound of a
// reconnect's handshake (at most 10s, so that a session asked for a day
// does not wait that long on a silent server), and again after every
// reconnect (another server of the ensemble may grant another value).
// New's own session has the timeout declared with WithSessionTimeout,
// checked against what the server grants (see above).
//
// # Failure modes
//
//   - Session expired (StateExpired, or a reconnect with a new session):
//     the server has deleted the session's nodes; every lock of the
//     session is lost at once.
//   - Disconnected: the server may expire the session one session timeout
//     after it last heard from the client. On a leader or a standalone
//     server (the Locker asks each server it connects to which it is, with
//     the four-letter command srvr that ZooKeeper allows by default), the
//     Locker knows when that was at the latest on a session it dialed: the
//     send time of the last request (a ping, an operation) whose reply
//     came, since the server got it; bytes merely read (a watch
//     notification, a reply read late) do not count. Through a follower
//     (or a server that did not say) that is not enough: the leader
//     expires the session, and a follower passes the session's requests on
//     only when the leader next pings it, every half tick, so a follower
//     that stalls or loses the leader after answering leaves the leader
//     with an older view. There the Locker sends a sync every tenth of the
//     timeout (a follower passes a sync on to the leader before answering
//     it) and counts the session as last heard of at the send time of the
//     latest sync answered at least a quarter of the timeout (a bound of
//     half a tick while minSessionTimeout is at least two ticks, the
//     default) before the latest sync was sent, or at the connect request
//     that made or resumed the session if that is later. This gives the
//     locks of a silent follower up about half a timeout after its last
//     answer instead of nine tenths, never after the leader may expire
//     them; New's own session does the same with its syncs, and uses
//     go-zookeeper's receive timeout (below) in its first third of a
//     timeout on each connection and on a leader. The role is asked of
//     the address the connection reached (a name that stands for several
//     servers, as a load balancer's, may send another connection
//     elsewhere) and holds for that connection only. Limits: at a
//     timeout of exactly two ticks the quarter has no slack for the
//     leader's own delays, which the drift margin and the server's
//     rounding of expiries up to a tick cover; an observer behind an
//     ObserverMaster (3.6+) passes requests on through two hops, up to a
//     tick (counted as a follower: give such sessions a larger timeout or
//     drift margin); and a minSessionTimeout set below two ticks breaks
//     the bound.
//     It gives every lock of the session up at that moment + (negotiated
//     session timeout) − (drift margin, WithDriftMargin, default a tenth of
//     the timeout, kept below half of it), unless the client reconnects in
//     the same session first; then the locks stand, and the Locker checks
//     that each node still exists. Nodes of locks given up this way are
//     deleted if the session comes back after all. Deadlines run on the
//     monotonic clock: a step of the wall clock does not move them.
//   - Cut off one way (the server stops hearing the client, the client
//     still hears the server): go-zookeeper keeps the connection up as long
//     as notifications arrive, but no request is answered. On a session it
//     dialed the Locker gives the locks up by the same deadline as for a
//     disconnect, while still connected, and deletes their nodes once
//     requests are answered again. On New's own session it has no view
//     below go-zookeeper: through a follower its syncs give the same
//     deadline; on a leader it relies on go-zookeeper's receive timeout.
//   - A create whose answer is lost (the connection broke in between): the
//     Acquire lists the directory for its GUID and adopts the node. If it
//     gives up first (its context ends, the Locker closes), the Locker
//     still looks for that node once the session answers again, and
//     deletes it, so that no node of a live session is left to block the
//     key. Should the Locker be closed before it could, the node goes with
//     the session (for New, the caller's, which may live on).
//   - A node deleted from outside (an operator's deleteall, a test):
//     the holder's watch on its own node fires and the lock is lost (for
//     a lock whose watch was not set while it waited, at the latest when
//     the watch is set, 50ms after the acquisition).
//   - A Release whose connection closes before the server answers waits
//     for the connection to come back and deletes again (a node gone by
//     then was deleted by the first attempt, as the session lived). One
//     that cannot reach the server before its context ends gives the lock
//     up anyway (Done closes, the error says so); the node is deleted when
//     the connection returns, or ends with the session.
//   - Clock rates: the holder measures the session timeout on its own
//     clock and the server on its own; the drift margin covers a rate
//     difference up to a tenth, and the time a ping takes to reach the
//     server. A holder paused longer than the session timeout (GC, a
//     stopped VM) may resume before it notices the expiry: fence your
//     writes with the token.
//
// # Inspect
//
// Locker implements locker.Inspector: Inspect lists the key's lock
// directory and reports the lowest node's owner as the holder, with that
// node's czxid as the token, and a TTL and a Lease of 0: the lock lasts as
// long as its holder's session, and a node's stat names the session, not
// its timeout (a crashed holder shows until the server expires it).
// LockInfo.Owner is the holder's locker.WithOwner description: a mutex's
// node is created with it as its data (no request of its own); the
// families' nodes carry none. An ACL that denies Inspect READ on the node
// leaves Owner empty.
//
// # ACLs
//
// WithACL sets the ACL of lock nodes and directories. With a digest ACL
// (zk.DigestACL, or zk.AuthACL for "the authenticated creator") and
// WithAuth, clients of other identities can neither take the locks nor
// delete them. Mutexes and reader-writer locks need CREATE, READ and
// DELETE (and WRITE on directories for the one-request acquisition, which
// they do without otherwise); semaphores need WRITE on their nodes too.
//
// # TLS and least privilege
//
// WithTLS (URL: the zookeeper+tls scheme) makes the Locker's sessions
// speak TLS to the servers' secure client port (secureClientPort, with
// serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory),
// with a client certificate when the server asks for one
// (ssl.clientAuth=need). go-zookeeper retries a connection that fails in
// the background, so a call that ends waiting for a session adds why the
// latest attempt failed: "x509: certificate signed by unknown authority",
// a TLS alert from the server ("certificate required", or with TLS 1.2
// "handshake failure", with a note when the client gave no certificate).
// A TLS session also carries the x509 identity of its certificate, which
// zk.AuthACL (acl=creator) grants the nodes to as well: give each
// application a certificate of its own.
//
// The least a Locker needs: an identity (digest auth, WithAuth or
// user:password@) with CREATE (the lock directories), READ and DELETE
// (directories, where container nodes are not used) on the lock root,
// which an operator makes, and no right on the nodes above it: the Locker
// creates missing directories deepest first and goes up only when the
// server answers that a parent is missing, since ZooKeeper checks CREATE
// on the parent before it looks whether a node exists. Its own nodes get
// WithACL (acl=creator: zk.AuthACL(zk.PermAll)). The integration tests run
// the conformance suite as such an identity over TLS. ZooKeeper's digest
// auth takes any password (it names an identity), so a wrong password, like
// a user without rights, is refused by the ACLs at the first call: an
// error wrapping zk.ErrNoAuth that names the node whose ACL refused.
//
// # URL
//
// The package registers the schemes zookeeper and zookeeper+tls (TLS; see
// above) with locker.Open:
//
//	zookeeper://[user:password@]host1:2181,host2:2181[/root]?ttl=30s
//	zookeeper+tls://user:password@host1:2182/root?acl=creator&tls_ca=/etc/app/ca.pem&tls_cert=/etc/app/client.pem&tls_key=/etc/app/client.key
//
// The path is the root of the lock directories (WithPrefix; default
// /locker), or the parameter prefix (not both). A user and password add
// digest authentication (WithAuth). Parameters:
//
//	ttl=30s               WithDefaultTTL     (shared by every backend; see backend.Settings):
//	                                         the default TTL, and the primary session's timeout
//	drift_margin=1s       WithDriftMargin    (shared)
//	prefix=/app           WithPrefix         (shared; or the path)
//	token_base=N          WithTokenBase      (shared)
//	containers=false      WithoutContainers
//	acl=creator           lock nodes only for the URL's user (zk.AuthACL); default open
//	tls_ca=/path.pem      zookeeper+tls: the CAs that verify the servers (default: the system's)
//	tls_cert=/path.pem    zookeeper+tls: the client certificate (with tls_key)
//	tls_key=/path.pem     zookeeper+tls: its private key (PEM files on the client's machine)
//
// There is no session_timeout parameter (nor a WithSessionTimeout for
// Connect): a session's timeout is the lease of its locks, so it is the
// TTL; the parameter is refused with an error that says to use ttl.
//
// The other shared parameters, retry_interval and ddl, are checked and
// change nothing here (watches wake waiters; the lock directories are
// nodes, not schema); watchdog=false is refused: a lock lasts as long as
// the session. WithLogger (a *slog.Logger) has no URL form. Unknown,
// repeated or malformed parameters are errors wrapping
// locker.ErrInvalidURL, and no error shows the password. The Locker owns
// its connection.
//
// # At risk and logging
//
// A Handle is a locker.AtRisker: at risk while the connection is down (the
// session, and the lock, may live on until the server expires it), or while
// a connection the Locker dialed has heard nothing for half the session
// timeout; cleared once back in the same session, or once answers resume.
// The locks of one session share its risk. WithLogger logs the session
// established, disconnected, reconnected and expired, each loss and why, and
// go-zookeeper's own messages; nothing without it.
package zookeeper
