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

	// keys holds an entry for every key that is held. A key that is free
	// has no entry: there are never waiters on a free key, because a release
	// hands the key to the first waiter in the same step.
	keys map[string]*entry

	// lastToken is the fencing token most recently issued on any key of the
	// store, like etcd's store-wide revision. Each grant takes the next
	// value, so the tokens of one key strictly increase across holders for
	// the life of the Store, with no per-key state to keep after release.
	lastToken int64
}

// entry is the server-side state of one held key.
type entry struct {
	holder  *grant
	waiters list.List // of *waiter, oldest first: the key is handed out FIFO
}

// grant is one holder's lease on one key: what a server records (owner,
// token, expiry) plus, because we are in-process, the holder's backend.State,
// which the store ends with ErrLost when the lease expires.
//
// The grant pointer itself is the owner identity: release and renew compare
// it with the key's current holder (compare-and-delete, never a blind delete),
// as a network backend compares a random owner string.
type grant struct {
	key   string
	token int64
	ttl   time.Duration
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
	key string
	ttl time.Duration

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

// acquire grants key when it is free. When it is held, acquire fails with
// ErrNotAcquired if wait is false, and otherwise queues and returns a waiter
// whose ready channel will receive the grant once the key is handed to it.
func (s *Store) acquire(key string, ttl time.Duration, wait bool) (*grant, *waiter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[key]
	if e == nil {
		e = &entry{}
		s.keys[key] = e
		return s.grantLocked(e, key, ttl), nil, nil
	}
	if !wait {
		return nil, nil, locker.ErrNotAcquired
	}
	w := &waiter{key: key, ttl: ttl, ready: make(chan reply, 1)}
	w.elem = e.waiters.PushBack(w)
	return nil, w, nil
}

// grantLocked makes a new holder of the free entry e, with the next fencing
// token and a lease that runs out after ttl unless renewed.
func (s *Store) grantLocked(e *entry, key string, ttl time.Duration) *grant {
	s.lastToken++
	now := time.Now()
	g := &grant{
		key:      key,
		token:    s.lastToken,
		ttl:      ttl,
		start:    now,
		state:    backend.NewState(),
		deadline: now.Add(ttl),
	}
	// A timer, not polling: the key goes to the next waiter the moment the
	// lease runs out.
	g.timer = time.AfterFunc(ttl, func() { s.expire(g) })
	e.holder = g
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
	s.keys[w.key].waiters.Remove(w.elem)
	w.elem = nil
	w.ready <- reply{err: err}
}

// release ends g, if it still holds its key, with why (ErrReleased, or the
// loss error when its Locker is closing), and hands the key to the next
// waiter. It reports false, touching nothing, when g no longer holds the key:
// its lease expired, and the key may belong to someone else by now.
func (s *Store) release(g *grant, why error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[g.key]
	if e == nil || e.holder != g {
		return false
	}
	g.timer.Stop() // if expire is already waiting for s.mu, it finds e.holder != g
	g.state.End(why)
	s.handOffLocked(e)
	return true
}

// renew extends g's lease by its TTL from now. It reports false when g no
// longer holds its key, or when its lease has run out and the expiry timer
// has merely not fired yet: a late renewal never revives a lease.
func (s *Store) renew(g *grant) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[g.key]
	if e == nil || e.holder != g {
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
	e := s.keys[g.key]
	if e == nil || e.holder != g {
		return
	}
	g.timer.Stop()
	s.handOffLocked(e)
}

// expire runs when g's lease timer fires.
func (s *Store) expire(g *grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[g.key]
	if e == nil || e.holder != g {
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
	s.handOffLocked(e)
}

// handOffLocked gives the key of e, whose holder just left, to the oldest
// waiter, or forgets the key when nobody waits.
func (s *Store) handOffLocked(e *entry) {
	key := e.holder.key
	e.holder = nil
	front := e.waiters.Front()
	if front == nil {
		delete(s.keys, key)
		return
	}
	w := e.waiters.Remove(front).(*waiter)
	w.elem = nil
	w.ready <- reply{g: s.grantLocked(e, key, w.ttl)}
}

func (s *Store) inspect(key string) locker.LockInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	info := locker.LockInfo{Key: key}
	if e := s.keys[key]; e != nil && e.holder != nil {
		info.Held = true
		info.Token = e.holder.token
		info.TTL = max(time.Until(e.holder.deadline), 0)
		info.Lease = e.holder.ttl
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
	e := s.keys[key]
	if e == nil || e.holder == nil {
		return false
	}
	g := e.holder
	g.timer.Stop()
	g.state.End(backend.KeyError("hold", key, fmt.Errorf("%w: revoked in the store (Store.Revoke)", locker.ErrLost)))
	s.handOffLocked(e)
	return true
}
