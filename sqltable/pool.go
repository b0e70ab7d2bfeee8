package sqltable

import (
	"context"
	"database/sql"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// A pin is a connection of the caller's pool that a Locker keeps beyond a
// statement: the PostgreSQL listener's, the MySQL bell connection, a wait
// for a MySQL bell. Pins are only for speed (they wake waiters); the lock's
// own statements (acquire, renewal, release) must never starve for them.
// The caller may change the pool's limit at any time (SetMaxOpenConns), so
// the limit is read when a pin is taken, not once at New, and pins let go
// of their connections as soon as the limit drops below minListenPool:
// before every lock statement of any Locker on the *sql.DB (the statement
// then gets the connection they free), and, for the races a statement's
// check cannot see (a limit lowered while a statement already waits for a
// connection, or by another Locker on the same *sql.DB), on a tick of each
// Locker that holds pins. A pin that lets go comes back at its next use
// once the limit allows it again; meanwhile waiters poll with the back-off.

// The acquisitions' share. An acquisition's statement (or a families
// transaction) may wait on the server for as long as another transaction
// keeps the key's row locked (an operator's SELECT ... FOR UPDATE, a
// client gone silent inside a transaction), holding its connection all
// that time. Enough of them would hold every connection of a limited pool,
// and the renewals of the locks already held, which need a connection
// too, would wait behind them until their leases ran out: a stuck key
// would cost its Locker every other lock. So the acquisitions of the
// Lockers on one *sql.DB (and their background clean-ups, which may wait
// on the same rows) take at most the pool's limit less the pins on pool
// connections (the bells', not the listener's, which has a connection of
// its own) and less acquireReserve connections at once; a further one
// waits (within its context) until one of them ends, and the connections
// left serve the renewals and releases. A bell's pin is not taken where it
// would eat into them (take). A pool without a limit, or whose limit leaves no
// room (below acquireReserve + 1 connections beside the pins), lets one
// acquisition at a time through at least, as before. Other users of a
// *sql.DB shared with the application are not counted: give the Locker a
// pool of its own (Open does) where they may hold every connection.

// acquireReserve is how many connections of a limited pool the
// acquisitions leave to the renewals and releases.
const acquireReserve = 1

// gateRecheck is how often an acquisition waiting for its share reads
// the pool's limit again (the caller may raise it; pins come and go). A
// variable for the tests, which make it long to see that the waiters are
// woken, not found by the re-check.
var gateRecheck = 100 * time.Millisecond

// enter waits until an acquisition may use the pool and returns the
// function that ends its use; ctx bounds the wait. Waiting acquisitions
// enter in the order they came (first come, first served, as
// semaphore.Weighted serves them): one that ends lets the first waiting
// one in, not every one at once to race for the place.
func (ps *pinSet) enter(ctx context.Context) (func(), error) {
	if ps == nil {
		return func() {}, nil
	}
	entered := func() (func(), error) {
		var once sync.Once
		return func() { once.Do(ps.exit) }, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ps.busyMu.Lock()
	if len(ps.queue) == 0 && ps.roomLocked() {
		ps.busy++
		ps.busyMu.Unlock()
		return entered()
	}
	w := make(chan struct{}, 1)
	ps.queue = append(ps.queue, w)
	ps.busyMu.Unlock()
	t := time.NewTimer(gateRecheck)
	defer t.Stop()
	for {
		select {
		case <-w:
		case <-t.C:
			t.Reset(gateRecheck) // the limit and the pins may have changed
		case <-ctx.Done():
			ps.busyMu.Lock()
			ps.dequeueLocked(w)
			ps.busyMu.Unlock()
			return nil, ctx.Err()
		}
		ps.busyMu.Lock()
		if ctx.Err() != nil { // woken as it gave up: it passes its turn on
			ps.dequeueLocked(w)
			ps.busyMu.Unlock()
			return nil, ctx.Err()
		}
		if ps.queue[0] == w && ps.roomLocked() {
			ps.dequeueLocked(w)
			ps.busy++
			ps.busyMu.Unlock()
			return entered()
		}
		ps.busyMu.Unlock()
	}
}

// roomLocked reports whether one more acquisition fits in the share: the
// pool's limit less the pins on pool connections less acquireReserve, and
// one at least; every one fits a pool without a limit.
func (ps *pinSet) roomLocked() bool {
	limit := ps.limit()
	return limit == 0 || ps.busy < max(limit-int(ps.pooled.Load())-acquireReserve, 1)
}

// dequeueLocked takes waiter w out of the queue; if the queue has a new
// first waiter, it wakes it (it may fit now).
func (ps *pinSet) dequeueLocked(w chan struct{}) {
	i := slices.Index(ps.queue, w)
	if i < 0 {
		return
	}
	ps.queue = slices.Delete(ps.queue, i, i+1)
	if i == 0 {
		ps.wakeFirstLocked()
	}
}

// wakeFirstLocked wakes the first waiting acquisition, if any, to look
// whether it fits.
func (ps *pinSet) wakeFirstLocked() {
	if len(ps.queue) > 0 {
		select {
		case ps.queue[0] <- struct{}{}:
		default: // woken already
		}
	}
}

// exit ends an acquisition's use of the pool and wakes the first waiting
// one.
func (ps *pinSet) exit() {
	ps.busyMu.Lock()
	ps.busy--
	ps.wakeFirstLocked()
	ps.busyMu.Unlock()
}

// minListenPool is the least pool limit at which a Locker pins connections:
// below it one pin could take the connection that a renewal needs.
const minListenPool = 4

// maxBellWaits bounds the pool connections that waiters keep waiting for
// bells (one per waited key, its head waiter in this process), per *sql.DB
// whatever the number of its Lockers: a quarter of a limited pool, at most
// this many.
const maxBellWaits = 4

// pinCheckEvery is how often a Locker that holds pins reads the pool's
// limit.
const pinCheckEvery = 200 * time.Millisecond

// pinSets are the pins of each *sql.DB used by a Locker, shared by its
// Lockers. An entry lives while a Locker uses its *sql.DB.
var pinSets = struct {
	sync.Mutex
	m map[*sql.DB]*pinSet
}{m: map[*sql.DB]*pinSet{}}

type pinSet struct {
	db   *sql.DB
	refs int          // guarded by pinSets
	n    atomic.Int32 // the pins
	// The pins that hold a connection of the pool (the listener's is a
	// connection of its own, made with a pooled one's settings).
	pooled atomic.Int32

	mu    sync.Mutex
	pins  map[*pin]struct{}
	waits int // pins that are bell waits

	// The acquisitions' share of the pool (see enter).
	busyMu sync.Mutex
	busy   int             // acquisitions in flight on the pool, of every Locker
	queue  []chan struct{} // the waiting ones, first come first; each woken by a send
}

type pin struct {
	owner   *Locker
	wait    bool
	pooled  bool   // holds one of the pool's connections
	letGo   func() // makes the holder give its connection back; may be called more than once
	evicted bool   // letGo has been called; guarded by pinSet.mu
}

// joinPins returns db's pins; the Locker leaves them when it closes.
func joinPins(db *sql.DB) *pinSet {
	pinSets.Lock()
	defer pinSets.Unlock()
	ps := pinSets.m[db]
	if ps == nil {
		ps = &pinSet{db: db, pins: map[*pin]struct{}{}}
		pinSets.m[db] = ps
	}
	ps.refs++
	return ps
}

func (ps *pinSet) leave() {
	if ps == nil {
		return
	}
	pinSets.Lock()
	defer pinSets.Unlock()
	if ps.refs--; ps.refs <= 0 {
		delete(pinSets.m, ps.db)
	}
}

// limit is the pool's current limit (0: none).
func (ps *pinSet) limit() int { return ps.db.Stats().MaxOpenConnections }

func roomFor(limit int) bool { return limit == 0 || limit >= minListenPool }

// fits reports whether the pool's limit allows pins now.
func (ps *pinSet) fits() bool { return ps != nil && roomFor(ps.limit()) }

// take records a pin of owner that letGo ends, if the pool has room for
// one now (for a bell wait: if fewer than a quarter of a limited pool, at
// most maxBellWaits, are in flight; for a pin on a connection of the pool
// (pooled): if it leaves the acquisitions in flight their connections and
// the renewals theirs, see enter); nil when it has not. The holder calls
// drop once it has given the connection back.
func (ps *pinSet) take(owner *Locker, wait, pooled bool, letGo func()) *pin {
	if ps == nil {
		return nil
	}
	limit := ps.limit()
	if !roomFor(limit) {
		return nil
	}
	if pooled {
		// Held across the rest, so that no acquisition enters between
		// the check and the count.
		ps.busyMu.Lock()
		defer ps.busyMu.Unlock()
		// Nor while acquisitions wait for their share: the place one
		// that ends frees is the first waiter's, not a pin's.
		if limit != 0 && (ps.busy+int(ps.pooled.Load())+1+acquireReserve > limit || len(ps.queue) > 0) {
			return nil
		}
	}
	ps.mu.Lock()
	if wait {
		n := maxBellWaits
		if limit != 0 {
			n = min(n, limit/minListenPool)
		}
		if ps.waits >= n {
			ps.mu.Unlock()
			return nil
		}
		ps.waits++
	}
	p := &pin{owner: owner, wait: wait, pooled: pooled, letGo: letGo}
	ps.pins[p] = struct{}{}
	ps.n.Add(1)
	if pooled {
		ps.pooled.Add(1)
	}
	ps.mu.Unlock()
	owner.pinned.Add(1)
	if owner.watching.CompareAndSwap(false, true) && !owner.life.Go(owner.watchPool) {
		owner.watching.Store(false) // Close has begun: it ends the pins
	}
	return p
}

// drop forgets p: its holder no longer has the connection.
func (ps *pinSet) drop(p *pin) {
	if p == nil {
		return
	}
	ps.mu.Lock()
	if _, ok := ps.pins[p]; ok {
		delete(ps.pins, p)
		ps.n.Add(-1)
		if p.pooled {
			ps.pooled.Add(-1)
		}
		if p.wait {
			ps.waits--
		}
		p.owner.pinned.Add(-1)
	}
	ps.mu.Unlock()
}

// check makes every pin on the pool let go of its connection when the
// pool's limit no longer allows pins; cheap when there are none. It runs
// before each lock statement.
func (ps *pinSet) check() {
	if ps == nil || ps.n.Load() == 0 || ps.fits() {
		return
	}
	ps.evict()
}

func (ps *pinSet) evict() {
	var letGo []func()
	ps.mu.Lock()
	for p := range ps.pins {
		if !p.evicted {
			p.evicted = true
			letGo = append(letGo, p.letGo)
		}
	}
	ps.mu.Unlock()
	for _, f := range letGo {
		f()
	}
}

// watchPool reads the pool's limit every pinCheckEvery while l holds pins,
// until Close, and makes the pins on the pool let go of their connections
// when the limit drops too low.
func (l *Locker) watchPool() {
	t := time.NewTicker(pinCheckEvery)
	defer t.Stop()
	for {
		for l.pinned.Load() > 0 {
			select {
			case <-t.C:
				l.pins.check()
			case <-l.life.Closing().Done():
				l.watching.Store(false)
				return
			}
		}
		l.watching.Store(false)
		// A pin taken since the loop ended found the watch still on.
		if l.pinned.Load() == 0 || !l.watching.CompareAndSwap(false, true) {
			return
		}
	}
}
