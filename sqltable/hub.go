package sqltable

import (
	"context"
	"slices"
	"sync"
	"time"
)

// How a waiter learns that the lock it waits for was released: the wake
// plumbing, in one place.
//
// Every waiter of this process registers in procHub (below), keyed by the
// table (Locker.hubKey) and the key, and sleeps until the hub wakes it,
// its back-off or safety-net timer runs out, or its context ends (acquire.go,
// Locker.await). A release by any Locker of this process wakes the hub at
// once. Releases in other processes come through the Locker's waker, one
// of three, each in its own file:
//
//   - PostgreSQL: the listener (listener.go), one connection per Locker
//     that LISTENs on the table's channel and hands each NOTIFY to the hub;
//   - SQLite: the database file's signal (sqltable/sqlite, filewake.go), a file beside the
//     database that every release writes and one watch per file and process
//     (sqltable/sqlite's process-wide fileWakes) turns into wake-ups of the hub;
//   - MySQL: the bell (bell.go), a named lock that a holder takes and gives
//     back at its release, which the head waiter of a key (the hub says
//     which, needsBell) waits for itself, on a connection of the pool.
//
// The listener's and the bell's connections are pins of the caller's pool
// (pool.go): the process-wide pinSets count them per *sql.DB and bound the
// bell waits (maxBellWaits) across its Lockers; pins let go when the pool's
// limit drops too low. Each waker is only for speed: the row stays the only
// truth, and a lost wake-up costs a waiter at most its retry interval.
//
// So three things are process-wide: procHub (the waiters, here), fileWakes
// (the SQLite signal files and their watches) and pinSets (the pinned
// connections and bell waits of each *sql.DB).

// A waker brings the releases of other processes to this process's
// waiters: the listener, the file signal or the bell (see above), one per
// Locker (Locker.wake), or noWaker. The listener and the file signal wake
// the waiters through procHub, as a release in this process does; the
// bell is waited on by the waiter itself.
type waker interface {
	// start starts, if it is not running, what brings the releases here,
	// and reports whether it does now (it may wait for it, within ctx).
	start(ctx context.Context) bool
	// up reports whether releases anywhere wake the waiters now: a waiter
	// then sleeps the retry interval (the safety net for a lost wake-up)
	// instead of the back-off.
	up() bool
	// wait waits, for a waker that the waiter itself waits on (the bell),
	// until w's key may have been released or limit has passed. rang
	// reports that a release came; ok is false when it did not wait (the
	// waiter sleeps instead).
	wait(ctx context.Context, w *waiter, key string, limit time.Duration) (rang, ok bool)
}

// noWaker is the waker of a Locker whose waiters poll (WithNotify(false),
// or no way to hear other processes): only this process's releases wake
// them.
type noWaker struct{}

func (noWaker) start(context.Context) bool { return false }
func (noWaker) up() bool                   { return false }
func (noWaker) wait(context.Context, *waiter, string, time.Duration) (bool, bool) {
	return false, false
}

// procHub wakes the waiters of this process when a lock they wait for is
// released: by a Locker of this process (at once), or, in any process, on
// PostgreSQL through a Locker's listener and on SQLite through the
// database's signal file (see sqltable/sqlite, filewake.go). (On MySQL the head waiter of a
// key that nobody in this process holds waits for the holder's bell
// itself, see bell.go; the hub tells it whether to.) Waiters are keyed by
// dialect, database, table name and key (Locker.hubKey), so a release through any
// Locker of the process on the same table wakes them, whatever *sql.DB it
// uses, and a release on another database with a table of the same name
// wakes nobody there. The database is told by what it says of itself (see
// dbIdentity), or, when it cannot say, by the *sql.DB.
//
// A release wakes one waiter of the key, the longest waiting, not all of
// them: the others would only fail their tries (and on PostgreSQL queue on
// the row's lock). A waiter that leaves with a wake-up it did not act on
// passes it to the next one, so a wake-up is never lost. Releases are
// identified by the owner string of the lock released, so that the same
// release heard twice by the waiters of one table and key (from this
// process's own release, then from one or more listeners) wakes one
// waiter, not one per report.
//
// The waiters of the lock families (families.go) are in the same queues,
// under IDs of their own (famID), so that a table's wake (wakeTable) reaches
// them too; and each is also found by its row's owner (wakeOwner): a
// release names the waiting rows it admits, and wakes exactly those.
var procHub = &hub{keys: map[hubKey][]*waiter{}, tables: map[string]map[hubKey]struct{}{}, seen: recentReleases{at: map[string]time.Time{}}, held: map[hubKey]int{},
	owners: map[string]*waiter{}, signaled: recentReleases{at: map[string]time.Time{}}}

type hub struct {
	mu       sync.Mutex
	keys     map[hubKey][]*waiter           // in arrival order
	tables   map[string]map[hubKey]struct{} // table → the IDs in keys of its keys
	seen     recentReleases                 // release IDs heard recently
	held     map[hubKey]int                 // MySQL: locks held by this process's Lockers with a bell
	owners   map[string]*waiter             // the family waiters, by their row's owner
	signaled recentReleases                 // SQLite: family owners recently signalled to other processes
}

type waiter struct {
	table string
	id    hubKey
	c     chan struct{} // buffered: a wake-up never blocks the waker
	// A family waiter's row owner, and the wake-ups addressed to it (its
	// row is admitted); buffered.
	owner string
	oc    chan struct{}
	// seq: a mutex waiter's place in its key's queue (queue.go), noSeq
	// until it has one; the hub keeps a key's waiters in seq order, so
	// that a release wakes the first of them in the queue.
	seq int64
	// pending: the waiter took a wake-up from c and has not yet acted on
	// it (tried and found the key held). Used by the waiter's goroutine
	// only.
	pending bool
}

// woken records that the waiter took a wake-up from c.
func (w *waiter) woken() { w.pending = true }

// acted records that the waiter acted on its wake-ups: it tried the key
// and found it held, so the wake-up has nothing left to pass on.
func (w *waiter) acted() { w.pending = false }

// hubKey names a key of a table in the hub's maps: a struct, not the two
// joined, so that looking a key up makes no string (issue 32).
type hubKey struct{ table, key string }

func hubID(table, key string) hubKey { return hubKey{table, key} }

func (h *hub) watch(table, key string) *waiter {
	w := &waiter{table: table, id: hubID(table, key), c: make(chan struct{}, 1), seq: noSeq}
	h.mu.Lock()
	if len(h.keys[w.id]) == 0 {
		ids := h.tables[table]
		if ids == nil {
			ids = map[hubKey]struct{}{}
			h.tables[table] = ids
		}
		ids[w.id] = struct{}{}
	}
	h.keys[w.id] = append(h.keys[w.id], w)
	h.mu.Unlock()
	return w
}

// place records w's seq in its key's queue and moves w to its place among
// the key's waiters of this process: behind those with a lower seq, ahead
// of those with a higher one (and of those not queued yet).
func (h *hub) place(w *waiter, seq int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	q := h.keys[w.id]
	i := slices.Index(q, w)
	if i < 0 {
		return
	}
	q = slices.Delete(q, i, i+1)
	w.seq = seq
	j := slices.IndexFunc(q, func(o *waiter) bool { return o.seq > seq })
	if j < 0 {
		j = len(q)
	}
	h.keys[w.id] = slices.Insert(q, j, w)
}

// queued reports whether a waiter of this process has queued for key
// (see queue.go).
func (h *hub) queued(table, key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	q := h.keys[hubID(table, key)]
	return len(q) > 0 && q[0].seq != noSeq
}

// watchOwner registers a family waiter of key (famID) whose row carries
// owner: the table's wakes reach it as the head of its key, and wakeOwner
// reaches it by its owner.
func (h *hub) watchOwner(table, key, owner string) *waiter {
	w := h.watch(table, key)
	w.owner, w.oc = owner, make(chan struct{}, 1)
	h.mu.Lock()
	h.owners[owner] = w
	h.mu.Unlock()
	return w
}

// wakeOwner wakes the family waiter whose row carries owner, and reports
// whether it waits in this process.
func (h *hub) wakeOwner(owner string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.owners[owner]
	if w == nil {
		return false
	}
	select {
	case w.oc <- struct{}{}:
	default:
	}
	return true
}

// signal reports whether the admission of owner's row, waiting in another
// process, is to be signalled (SQLite's signal file): once, not by every
// waiter that finds it admitted before it takes its grant.
func (h *hub) signal(owner string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.signaled.heard(owner, time.Now())
}

// leave removes w. unacted says w leaves without the lock (its context
// ended, or a statement failed): a wake-up it took or holds and did not
// act on goes to the next waiter, so that a release is never lost.
func (h *hub) leave(w *waiter, unacted bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if w.owner != "" && h.owners[w.owner] == w {
		delete(h.owners, w.owner)
	}
	q := h.keys[w.id]
	if i := slices.Index(q, w); i >= 0 {
		q = slices.Delete(q, i, i+1)
	}
	if len(q) == 0 {
		delete(h.keys, w.id)
		if ids := h.tables[w.table]; ids != nil {
			delete(ids, w.id)
			if len(ids) == 0 {
				delete(h.tables, w.table)
			}
		}
		return
	}
	h.keys[w.id] = q
	if unacted && (w.pending || len(w.c) > 0) {
		h.wakeOneLocked(w.id) // pass on the wake-up w did not act on
	}
}

// hold and unhold count the locks of key held in this process (by Lockers
// with a bell): their waiters here need no bell, the release wakes them.
func (h *hub) hold(table, key string) {
	h.mu.Lock()
	h.held[hubID(table, key)]++
	h.mu.Unlock()
}

func (h *hub) unhold(table, key string) {
	id := hubID(table, key)
	h.mu.Lock()
	if h.held[id]--; h.held[id] <= 0 {
		delete(h.held, id)
	}
	h.mu.Unlock()
}

// holds reports whether a lock of this process, with a bell, holds key
// (see hold).
func (h *hub) holds(table, key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held[hubID(table, key)] > 0
}

// needsBell reports whether w is the longest waiting waiter of its key in
// this process (the one a release wakes) and nobody in this process holds
// the key (so that only another process's release can wake it, by its
// bell).
func (h *hub) needsBell(w *waiter) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	q := h.keys[w.id]
	return len(q) > 0 && q[0] == w && h.held[w.id] == 0
}

// wake wakes the longest waiting waiter of key, once per release: a
// release ID (the released lock's owner) already heard by the waiters of
// this table and key is ignored. A heard mark stops only a duplicate that
// would reach the same waiters: Lockers of one process whose database
// identity differs (another search_path, host string or address of the
// same server) keep their waiters apart, and the releasing Locker's own
// wake, which reaches none of the other's, must not stop the NOTIFY that
// reaches them. A report that finds no waiter leaves no mark either: a
// waiter that registers later tries again anyway, and a later report only
// costs it a try.
func (h *hub) wake(table, key, release string) {
	id := hubID(table, key)
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.keys[id]) == 0 {
		return
	}
	if release != "" && h.seen.heard(id.table+"\x00"+id.key+"\x00"+release, time.Now()) {
		return
	}
	h.wakeOneLocked(id)
}

// The release IDs a hub remembers: those heard in the last releaseMemory
// (a second report of a release comes within milliseconds: a listener's
// NOTIFY, the signal file), at most maxReleases of them.
const (
	releaseMemory = 10 * time.Second
	maxReleases   = 8192
)

// recentReleases remembers release IDs in the order they were heard and
// forgets the oldest first, so that remembering one costs O(1) amortised
// whatever the rate of releases. (It used to sweep the whole map on every
// release once it held 4096 IDs, which a process that releases a few
// hundred locks a second reaches: that sweep came to about half of an
// uncontended Acquire+Release on MariaDB, see BENCHMARKS.md.)
type recentReleases struct {
	at    map[string]time.Time
	order []heardRelease // order[head:] are remembered, oldest first
	head  int
}

type heardRelease struct {
	id string
	at time.Time
}

// heard reports whether id was heard already and, if not, remembers it as
// heard at now, which must not be before the last call's.
func (r *recentReleases) heard(id string, now time.Time) bool {
	if _, dup := r.at[id]; dup {
		return true
	}
	for r.head < len(r.order) && (now.Sub(r.order[r.head].at) > releaseMemory || len(r.at) >= maxReleases) {
		delete(r.at, r.order[r.head].id)
		r.order[r.head] = heardRelease{}
		r.head++
	}
	if r.head > 64 && r.head > len(r.order)/2 {
		// Move the remembered ones to the front: a copy of at most as many
		// as were forgotten since the last move.
		n := copy(r.order, r.order[r.head:])
		clear(r.order[n:])
		r.order, r.head = r.order[:n], 0
	}
	r.at[id] = now
	r.order = append(r.order, heardRelease{id, now})
	return false
}

func (h *hub) wakeOneLocked(id hubKey) {
	q := h.keys[id]
	if len(q) == 0 {
		return
	}
	// The head already has a wake-up to act on: it tries soon.
	select {
	case q[0].c <- struct{}{}:
	default:
	}
}

// wakeTable wakes the head waiter of every key of table: after the
// listening connection was (re)established, when releases may have gone
// unheard, and on every write to an SQLite database's signal file.
// It looks at that table's keys only, not at every key waited on in the
// process.
func (h *hub) wakeTable(table string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id := range h.tables[table] {
		h.wakeOneLocked(id)
	}
}
