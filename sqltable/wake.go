package sqltable

import (
	"context"
	"database/sql/driver"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/go-locker/locker/internal/backoff"
)

// procHub wakes the waiters of this process when a lock they wait for is
// released: by a Locker of this process (at once), or, in any process, on
// PostgreSQL through a Locker's listener and on SQLite through the
// database's signal file (see filewake.go). (On MySQL the head waiter of a
// key that nobody in this process holds waits for the holder's bell
// itself, see bell.go; the hub tells it whether to.) Waiters are keyed by dialect,
// database, table name and key (Locker.hubKey), so a release through any
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
var procHub = &hub{keys: map[string][]*waiter{}, tables: map[string]map[string]struct{}{}, seen: recentReleases{at: map[string]time.Time{}}, held: map[string]int{}}

type hub struct {
	mu     sync.Mutex
	keys   map[string][]*waiter           // in arrival order
	tables map[string]map[string]struct{} // table → the IDs in keys of its keys
	seen   recentReleases                 // release IDs heard recently
	held   map[string]int                 // MySQL: locks held by this process's Lockers with a bell, by hubID
}

type waiter struct {
	table string
	id    string
	c     chan struct{} // buffered: a wake-up never blocks the waker
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

func hubID(table, key string) string { return table + "\x00" + key }

func (h *hub) watch(table, key string) *waiter {
	w := &waiter{table: table, id: hubID(table, key), c: make(chan struct{}, 1)}
	h.mu.Lock()
	if len(h.keys[w.id]) == 0 {
		ids := h.tables[table]
		if ids == nil {
			ids = map[string]struct{}{}
			h.tables[table] = ids
		}
		ids[w.id] = struct{}{}
	}
	h.keys[w.id] = append(h.keys[w.id], w)
	h.mu.Unlock()
	return w
}

// leave removes w. unacted says w leaves without the lock (its context
// ended, or a statement failed): a wake-up it took or holds and did not
// act on goes to the next waiter, so that a release is never lost.
func (h *hub) leave(w *waiter, unacted bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
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
	if release != "" && h.seen.heard(id+"\x00"+release, time.Now()) {
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

func (h *hub) wakeOneLocked(id string) {
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

// A waker brings the releases of other processes to this process's
// waiters: the PostgreSQL listener (wake.go), the SQLite file signal
// (filewake.go) or the MySQL bell (bell.go), one per Locker (Locker.wake),
// or noWaker. The listener and the file signal wake the waiters through
// procHub, as a release in this process does; the bell is waited on by
// the waiter itself.
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

// listener keeps one connection of a PostgreSQL Locker's pool listening on
// the table's channel, from the first wait until Close, and wakes the
// process's waiters of each key released anywhere.
type listener struct {
	l       *Locker
	enabled atomic.Bool

	mu        sync.Mutex
	started   bool
	listening bool
	ready     chan struct{} // closed when LISTEN is in effect
	stop      context.CancelFunc
	done      chan struct{}
}

func newListener(l *Locker) *listener {
	ls := &listener{l: l, ready: make(chan struct{})}
	// The pool's limit is read when the listener takes its connection
	// (see pool.go), not here: the caller may change it after New.
	ls.enabled.Store(l.dialect == PostgreSQL && l.cfg.notify)
	return ls
}

// start starts the listener if it is not running and waits, boundedly,
// until it listens; it reports whether it does.
func (ls *listener) start(ctx context.Context) bool {
	if ls == nil || !ls.enabled.Load() || !ls.l.pins.fits() {
		return false // no listener, or a pool too small for one now
	}
	ls.mu.Lock()
	if !ls.started {
		lctx, stop := context.WithCancel(ls.l.life.Closing())
		done := make(chan struct{})
		if !ls.l.life.Go(func() { defer close(done); ls.run(lctx) }) {
			stop()
			ls.mu.Unlock()
			return false
		}
		ls.started, ls.stop, ls.done = true, stop, done
	}
	ready := ls.ready
	ls.mu.Unlock()
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-ready:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// wait does not wait: the listener wakes the waiters through procHub.
func (*listener) wait(context.Context, *waiter, string, time.Duration) (bool, bool) {
	return false, false
}

// up reports whether the listener is listening now.
func (ls *listener) up() bool {
	if ls == nil || !ls.enabled.Load() {
		return false
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.listening
}

func (ls *listener) close() {
	ls.mu.Lock()
	stop, done := ls.stop, ls.done
	ls.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

func (ls *listener) setListening(on bool) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if on == ls.listening {
		return
	}
	ls.listening = on
	if on {
		close(ls.ready)
	} else {
		ls.ready = make(chan struct{})
	}
}

// listenIdle turns off the listening session's idle_session_timeout where
// the server has one.
const listenIdle = `SELECT pg_catalog.set_config('idle_session_timeout', '0', false) WHERE pg_catalog.current_setting('idle_session_timeout', true) IS NOT NULL`

// run listens until ctx ends, reconnecting after a failure.
func (ls *listener) run(ctx context.Context) {
	back := backoff.New(50*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		if ls.listenOnce(ctx) {
			back.Reset()
		}
		ls.setListening(false)
		back.Wait(ctx)
	}
}

// listenOnce takes a connection, listens on it until it fails, ctx ends or
// the pool's limit drops too low for it (see pool.go), then discards it (a
// connection that listened must not go back to the pool). It reports
// whether LISTEN took effect.
func (ls *listener) listenOnce(ctx context.Context) (listened bool) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p := ls.l.pins.take(ls.l, false, cancel)
	if p == nil {
		return false // no room in the pool now: waiters poll
	}
	defer ls.l.pins.drop(p)
	conn, err := ls.l.db.Conn(ctx)
	if err != nil {
		return false
	}
	defer conn.Close()
	_ = conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			ls.enabled.Store(false) // a wrapped driver: no LISTEN
			return driver.ErrBadConn
		}
		c := sc.Conn()
		if _, err := c.Exec(ctx, `LISTEN "`+ls.l.table.channel()+`"`); err != nil {
			return driver.ErrBadConn
		}
		// The listening session is idle by design: a server that ends
		// idle sessions (idle_session_timeout, PostgreSQL 14+) would end
		// it again and again, each time costing the waiters a round of
		// tries. The connection is discarded afterwards, never pooled.
		if _, err := c.Exec(ctx, listenIdle); err != nil {
			return driver.ErrBadConn
		}
		listened = true
		ls.setListening(true)
		// Releases made while nobody listened were not heard.
		procHub.wakeTable(ls.l.hubKey)
		for {
			n, err := c.WaitForNotification(ctx)
			if err != nil {
				return errors.Join(driver.ErrBadConn, err)
			}
			// The payload is "owner:key" (owners have no ':').
			owner, key, ok := strings.Cut(n.Payload, ":")
			if ok {
				procHub.wake(ls.l.hubKey, key, owner)
			}
		}
	})
	return listened
}
