package memlock

import (
	"container/list"
	"fmt"
	"sync"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// Store is one keyspace: the in-process stand-in for a lock server. Lockers
// made from the same Store contend for the same keys, as separate processes
// sharing one server would; Lockers on different Stores never meet.
//
// A Store needs no closing: it runs no goroutine of its own, only a timer
// per held lease whose callback runs for a moment when it fires. Its memory is
// proportional to the keys currently held and the callers waiting for them;
// a key that is released and has no waiters leaves nothing behind.
//
// The Store is the only authority on who holds a key. Everything it does
// happens under one mutex and never blocks, so every method below is one
// atomic step, like one Lua script or one transaction on a real server.
type Store struct {
	mu sync.Mutex

	// keys holds an entry for every key that is held, by store key (see
	// storeKey: each lock family has a keyspace of its own). A key that is
	// free has no entry: there are never waiters on a free key, because a
	// release hands the key to the first waiters in the same step.
	keys map[string]*entry

	// lastToken is the fencing token most recently issued on any key of the
	// store, like etcd's store-wide revision. Each grant takes the next
	// value, so the tokens of one key strictly increase across holders for
	// the life of the Store, with no per-key state to keep after release.
	lastToken int64
}

// entry is the server-side state of one held key: its holders (one for a
// mutex or a write lock; any number of readers; at most limit permits of a
// semaphore) and its waiters.
type entry struct {
	holders map[*grant]struct{}
	limit   int       // a semaphore's n, fixed while the entry exists; 0 for the other families
	waiters list.List // of *waiter, oldest first: the key is handed out FIFO
}

// kind is what a grant holds of its key.
type kind uint8

const (
	exclusive kind = iota // a mutex, or a write lock
	shared                // a read lock
	permit                // one permit of a semaphore
)

// mode is what an acquisition asks for: a kind, in the keyspace of a
// family, and a semaphore's limit.
type mode struct {
	kind  kind
	space string // prefix of the family's store keys: see storeKey
	limit int    // permit only
}

// The modes of the families. Each family has a keyspace of its own: a
// mutex's store key is the key itself; the others are prefixed with a NUL
// byte, which no valid key contains, so no two (family, key) pairs share a
// store key.
var (
	mutexMode = mode{kind: exclusive}
	rwRead    = mode{kind: shared, space: "\x00rw\x00"}
	rwWrite   = mode{kind: exclusive, space: "\x00rw\x00"}
)

// semaphoreMode is the mode of a permit of a semaphore of n.
func semaphoreMode(n int) mode { return mode{kind: permit, space: "\x00sem\x00", limit: n} }

// storeKey is the store key of key in m's family.
func storeKey(m mode, key string) string { return m.space + key }

// admits reports whether e, with its current holders, admits one more
// holder of mode m (ignoring the waiters ahead of it).
func (e *entry) admits(m mode) bool {
	if len(e.holders) == 0 {
		return true
	}
	switch m.kind {
	case shared:
		for g := range e.holders {
			if g.kind != shared {
				return false
			}
		}
		return true
	case permit:
		return len(e.holders) < e.limit
	default:
		return false
	}
}

// holdersOrNil returns e's holders, or nil when e is nil.
func (e *entry) holdersOrNil() map[*grant]struct{} {
	if e == nil {
		return nil
	}
	return e.holders
}

// holds reports whether g holds e's key.
func (e *entry) holds(g *grant) bool {
	if e == nil {
		return false
	}
	_, ok := e.holders[g]
	return ok
}

// grant is one holder's lease on one key: what a server records (owner,
// token, expiry) plus, because we are in-process, the holder's backend.State,
// which the store ends with ErrLost when the lease expires.
//
// The grant pointer itself is the owner identity: release and renew compare
// it with the key's current holder (compare-and-delete, never a blind delete),
// as a network backend compares a random owner string.
type grant struct {
	key   string // the caller's key
	skey  string // the store key (storeKey)
	kind  kind
	token int64
	ttl   time.Duration
	owner string    // the holder's description (locker.WithOwner), for Inspect
	start time.Time // when the key was granted; the first renewal is due at start+ttl/3

	// state is ended (closing the handle's Done) by the store, under
	// Store.mu: with ErrReleased by release, or with an error wrapping
	// ErrLost by expiry. Only a Locker cut off from the store ends its
	// handles itself, when they are released or it closes, leaving the
	// leases to run out. The first End wins.
	state *backend.State

	// Guarded by Store.mu.
	deadline time.Time   // the lease runs out at deadline unless renewed
	timer    *time.Timer // fires expire at deadline
}

// waiter is one blocked Acquire queued on a held key.
type waiter struct {
	key   string
	skey  string
	mode  mode
	ttl   time.Duration
	owner string

	// ready receives exactly one reply: a grant, or the error that ended the
	// wait. It is buffered so that the store never blocks sending it.
	ready chan reply

	elem *list.Element // position in entry.waiters; nil once dequeued (guarded by Store.mu)
}

type reply struct {
	g   *grant
	err error
}

// NewStore returns an empty keyspace.
func NewStore() *Store {
	return &Store{keys: make(map[string]*entry)}
}

// acquire grants key in mode m when the key admits it and nobody waits
// for it (first come, first served: a reader never overtakes a waiting
// writer). Otherwise acquire fails with ErrNotAcquired if wait is false, and
// queues and returns a waiter whose ready channel will receive the grant once
// the key is handed to it. A semaphore permit whose limit differs from the
// key's fails with ErrLimitMismatch.
func (s *Store) acquire(key string, m mode, ttl time.Duration, owner string, wait bool) (*grant, *waiter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	skey := storeKey(m, key)
	e := s.keys[skey]
	if e == nil {
		e = &entry{holders: make(map[*grant]struct{}), limit: max(m.limit, 0)}
		s.keys[skey] = e
	}
	if m.kind == permit && m.limit != e.limit {
		return nil, nil, fmt.Errorf("%w: the key is a semaphore of %d, asked for %d", locker.ErrLimitMismatch, e.limit, m.limit)
	}
	if e.waiters.Len() == 0 && e.admits(m) {
		return s.grantLocked(e, key, skey, m.kind, ttl, owner), nil, nil
	}
	if !wait {
		return nil, nil, locker.ErrNotAcquired
	}
	w := &waiter{key: key, skey: skey, mode: m, ttl: ttl, owner: owner, ready: make(chan reply, 1)}
	w.elem = e.waiters.PushBack(w)
	return nil, w, nil
}

// grantLocked makes a new holder of e, which admits it, with the next
// fencing token and a lease that runs out after ttl unless renewed.
func (s *Store) grantLocked(e *entry, key, skey string, k kind, ttl time.Duration, owner string) *grant {
	s.lastToken++
	now := time.Now()
	g := &grant{
		key:      key,
		skey:     skey,
		kind:     k,
		token:    s.lastToken,
		ttl:      ttl,
		owner:    owner,
		start:    now,
		state:    backend.NewState(),
		deadline: now.Add(ttl),
	}
	// A timer, not polling: the key goes to the next waiter the moment the
	// lease runs out.
	g.timer = time.AfterFunc(ttl, func() { s.expire(g) })
	e.holders[g] = struct{}{}
	return g
}

// cancelWait takes w out of its queue and answers it with err. When w has
// been answered already (the key was granted to it, or another cancelWait
// came first) it does nothing. Either way, w.ready then holds w's one answer.
func (s *Store) cancelWait(w *waiter, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.elem == nil {
		return
	}
	e := s.keys[w.skey]
	e.waiters.Remove(w.elem)
	w.elem = nil
	w.ready <- reply{err: err}
	// A writer that gave up may have held back the readers queued behind
	// it; a key nobody holds or waits for any more is forgotten.
	s.admitLocked(e, w.skey)
}

// release ends g, if it still holds its key, with why (ErrReleased, or the
// loss error when its Locker is closing), and hands the key to the next
// waiter. It reports false, touching nothing, when g no longer holds the key:
// its lease expired, and the key may belong to someone else by now.
func (s *Store) release(g *grant, why error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[g.skey]
	if !e.holds(g) {
		return false
	}
	g.timer.Stop() // if expire is already waiting for s.mu, it finds g gone
	g.state.End(why)
	s.handOffLocked(e, g)
	return true
}

// renew extends g's lease by its TTL from now. It reports false when g no
// longer holds its key, or when its lease has run out and the expiry timer
// has merely not fired yet: a late renewal never revives a lease.
func (s *Store) renew(g *grant) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[g.skey]
	if !e.holds(g) {
		return false
	}
	now := time.Now()
	if !now.Before(g.deadline) {
		s.expireLocked(e, g)
		return false
	}
	g.deadline = now.Add(g.ttl)
	g.timer.Reset(g.ttl)
	return true
}

// errTakenAway is the loss of a lock that the store gave to nobody in
// particular: it was taken from its holder (steal) without the holder's lease
// running out.
var errTakenAway = fmt.Errorf("%w: the lock was taken away in the store", locker.ErrLost)

// steal takes g's key from it without telling g's holder, as an operator
// deleting a lock on a server would; the key goes to the next waiter. It is
// the conformance suite's Steal hook: the holder must find out by itself, at
// its next renewal, and its Release must touch nothing of the next holder's.
func (s *Store) steal(g *grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[g.skey]
	if !e.holds(g) {
		return
	}
	g.timer.Stop()
	s.handOffLocked(e, g)
}

// expire runs when g's lease timer fires.
func (s *Store) expire(g *grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[g.skey]
	if !e.holds(g) {
		return // released or expired already
	}
	if time.Now().Before(g.deadline) {
		return // renewed while this call waited for s.mu; the timer was reset
	}
	s.expireLocked(e, g)
}

// expireLocked takes the key from g, whose lease ran out, and hands it on.
//
// The old holder is told first, in the same atomic step, so its Done is
// closed before any new holder can exist. This is the in-process privilege:
// a network backend cannot reach a holder that is cut off, so its client must
// instead end the handle by its own deadline (lease start as measured before
// sending the request, plus TTL, minus a margin for clock drift).
func (s *Store) expireLocked(e *entry, g *grant) {
	g.state.End(fmt.Errorf("%w: lease of %v expired without renewal", locker.ErrLost, g.ttl))
	s.handOffLocked(e, g)
}

// handOffLocked takes g, which just left, from e's holders and admits the
// waiters that can hold now.
func (s *Store) handOffLocked(e *entry, g *grant) {
	delete(e.holders, g)
	s.admitLocked(e, g.skey)
}

// admitLocked grants e's key to its oldest waiters, in order, for as long
// as the key admits the next one (several readers, or several permits, at
// once), and forgets the key when nobody holds it or waits for it.
func (s *Store) admitLocked(e *entry, skey string) {
	for {
		front := e.waiters.Front()
		if front == nil {
			break
		}
		w := front.Value.(*waiter)
		if !e.admits(w.mode) {
			break
		}
		e.waiters.Remove(front)
		w.elem = nil
		w.ready <- reply{g: s.grantLocked(e, w.key, skey, w.mode.kind, w.ttl, w.owner)}
	}
	if len(e.holders) == 0 && e.waiters.Len() == 0 {
		delete(s.keys, skey)
	}
}

func (s *Store) inspect(key string) locker.LockInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	info := locker.LockInfo{Key: key}
	for g := range s.keys[storeKey(mutexMode, key)].holdersOrNil() {
		info.Held = true
		info.Token = g.token
		info.TTL = max(time.Until(g.deadline), 0)
		info.Lease = g.ttl
		info.Owner = g.owner
	}
	return info
}

// Revoke takes key's lock away from its holder, as an operator deleting a
// lock on a server would, and reports whether the key was held. The holder's
// Handle reports the loss (Done closes, Err wraps locker.ErrLost) and the key
// goes to the next waiter, with a higher token. It is for testing how a
// program handles the loss of a lock: its Release then returns an error
// wrapping locker.ErrLost and touches nothing of the next holder's.
//
// Unlike a server, the Store can tell the holder at once; a network backend's
// holder finds out at its next renewal at the latest.
func (s *Store) Revoke(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[storeKey(mutexMode, key)]
	if e == nil || len(e.holders) == 0 {
		return false
	}
	for g := range e.holders { // a mutex: one holder
		g.timer.Stop()
		g.state.End(backend.KeyError("hold", key, fmt.Errorf("%w: revoked in the store (Store.Revoke)", locker.ErrLost)))
		s.handOffLocked(e, g)
	}
	return true
}

// RevokeToken is Revoke for one holder of key in any lock family: it takes
// away the mutex, read lock, write lock or semaphore permit of key whose
// fencing token is token, and reports whether one was held. Its holder is
// told as by Revoke; the others keep theirs, and the waiters that now fit
// are admitted (a permit goes to the next waiter, with a higher token).
func (s *Store) RevokeToken(key string, token int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range []mode{mutexMode, rwRead, semaphoreMode(0)} {
		e := s.keys[storeKey(m, key)]
		for g := range e.holdersOrNil() {
			if g.token != token {
				continue
			}
			g.timer.Stop()
			g.state.End(backend.KeyError("hold", key, fmt.Errorf("%w: revoked in the store (Store.RevokeToken)", locker.ErrLost)))
			s.handOffLocked(e, g)
			return true
		}
	}
	return false
}
