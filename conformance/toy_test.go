package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// toy is a small in-memory Locker that the suite's own tests break on
// purpose, one flaw at a time, to prove that Run catches each flaw. Without
// flaws it keeps the contract, which proves the failures come from the flaws.
// It is deliberately simple; memlock is the reference backend.

type flaw int

const (
	noFlaw             flaw = iota
	noExclusion             // every attempt succeeds
	constantToken           // every holder gets token 1
	perLockerToken          // tokens count per Locker, not per key across Lockers
	blindRelease            // Release deletes whoever holds the key
	ownerPerLocker          // Release compares the holder's Locker, not the acquisition, and asks the store first
	ignoresContext          // waits ignore ctx
	silentLoss              // a lost lock never closes Done
	tryWaits                // TryAcquire waits up to a second for the key
	pollingWaiter           // waiters sleep 2s between attempts instead of being woken
	truncatedKeys           // keys are cut to 250 bytes in the store
	closeKeepsLocks         // Close ends its handles but leaves their keys to expire
	releaseIgnoresCtx       // a Release that cannot reach the store waits for it, ignoring ctx
	racyRelease             // concurrent Releases of one handle are not serialised
	blindRenewal            // the watchdog outlives Release and renews whoever holds the key
	retriesUnreachable      // Acquire and TryAcquire retry until the store answers, ignoring ctx
)

// toyMaxStoredKey is where truncatedKeys cuts keys, as a VARCHAR(250) would.
const toyMaxStoredKey = 250

type toyStore struct {
	mu    sync.Mutex
	held  map[string]*toyHandle
	fence map[string]int64
	wake  chan struct{} // closed and replaced on every change
}

func newToyStore() *toyStore {
	return &toyStore{held: map[string]*toyHandle{}, fence: map[string]int64{}, wake: make(chan struct{})}
}

// changedLocked wakes every waiter; s.mu must be held.
func (s *toyStore) changedLocked() {
	close(s.wake)
	s.wake = make(chan struct{})
}

type toyLocker struct {
	s    *toyStore
	flaw flaw

	mu      sync.Mutex
	closed  bool
	cut     bool
	dead    bool
	tokens  int64 // for perLockerToken
	handles map[*toyHandle]struct{}
	quit    chan struct{} // closed by Close: ends waits and watchdogs
	wg      sync.WaitGroup
}

func newToy(s *toyStore, f flaw) *toyLocker {
	return &toyLocker{s: s, flaw: f, handles: map[*toyHandle]struct{}{}, quit: make(chan struct{})}
}

type toyHandle struct {
	l       *toyLocker
	key     string
	sk      string // the key in the store
	token   int64
	ttl     time.Duration
	expires time.Time // guarded by s.mu
	st      *backend.State
	relMu   sync.Mutex // serialises Release
}

const toyTTL = 30 * time.Second

func (l *toyLocker) reachable() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return locker.ErrClosed
	case l.cut || l.dead:
		return errors.New("toy: backend unreachable")
	}
	return nil
}

// storeKey is key as the store sees it.
func (l *toyLocker) storeKey(key string) string {
	if l.flaw == truncatedKeys && len(key) > toyMaxStoredKey {
		return key[:toyMaxStoredKey]
	}
	return key
}

// try makes one attempt; on failure it returns the channel that signals the
// next change and when the current lease runs out.
func (l *toyLocker) try(key string, ttl time.Duration) (*toyHandle, <-chan struct{}, time.Time, error) {
	if err := l.reachable(); err != nil {
		return nil, nil, time.Time{}, err
	}
	sk := l.storeKey(key)
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if cur := s.held[sk]; cur != nil && l.flaw != noExclusion {
		if now.Before(cur.expires) {
			return nil, s.wake, cur.expires, nil
		}
		// The lease ran out: the old holder must know before we take over.
		if l.flaw != silentLoss {
			cur.st.End(locker.KeyError("renew", cur.key, locker.ErrLost))
		}
	}
	s.fence[sk]++
	h := &toyHandle{l: l, key: key, sk: sk, token: s.fence[sk], ttl: ttl, expires: now.Add(ttl), st: backend.NewState()}
	l.mu.Lock()
	if l.closed { // Close ran since reachable(): take nothing
		l.mu.Unlock()
		return nil, nil, time.Time{}, locker.ErrClosed
	}
	switch l.flaw {
	case constantToken:
		h.token = 1
	case perLockerToken:
		l.tokens++
		h.token = l.tokens
	}
	l.handles[h] = struct{}{}
	l.mu.Unlock()
	s.held[sk] = h
	l.wg.Add(1)
	go l.watchdog(h)
	return h, nil, time.Time{}, nil
}

func (l *toyLocker) acquire(ctx context.Context, key string, wait bool, opts []locker.Option) (locker.Handle, error) {
	if err := locker.ValidateKey(key); err != nil {
		return nil, err
	}
	o, err := locker.ApplyOptions(opts...)
	if err != nil {
		return nil, err
	}
	if o.TTL == 0 {
		o.TTL = toyTTL
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var giveUp <-chan time.Time // for tryWaits
	if !wait && l.flaw == tryWaits {
		giveUp = time.After(time.Second)
	}
	for {
		h, wake, expires, err := l.try(key, o.TTL)
		if err != nil && l.flaw == retriesUnreachable && l.isCut() {
			time.Sleep(10 * time.Millisecond) // a transient network error: try again
			continue
		}
		if err != nil || h != nil {
			return h, err
		}
		if !wait && giveUp == nil {
			return nil, locker.KeyError("try-acquire", key, locker.ErrNotAcquired)
		}
		timer := time.NewTimer(time.Until(expires))
		if l.flaw == pollingWaiter {
			wake = nil
			timer.Reset(2 * time.Second)
		}
		done := ctx.Done()
		if l.flaw == ignoresContext {
			done = nil
		}
		select {
		case <-wake:
		case <-timer.C:
		case <-giveUp:
			timer.Stop()
			return nil, locker.KeyError("try-acquire", key, locker.ErrNotAcquired)
		case <-l.quit:
			timer.Stop()
			return nil, locker.KeyError("acquire", key, locker.ErrClosed)
		case <-done:
			timer.Stop()
			return nil, locker.KeyError("acquire", key, ctx.Err())
		}
		timer.Stop()
	}
}

func (l *toyLocker) Acquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return l.acquire(ctx, key, true, opts)
}

func (l *toyLocker) TryAcquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return l.acquire(ctx, key, false, opts)
}

// watchdog renews h every TTL/3 and declares it lost once renewals have
// failed for TTL minus a margin, before the store can hand the key on.
func (l *toyLocker) watchdog(h *toyHandle) {
	defer l.wg.Done()
	tick := time.NewTicker(h.ttl / 3)
	defer tick.Stop()
	lastOK := time.Now()
	for {
		done := h.st.Done()
		if l.flaw == blindRenewal {
			done = nil
		}
		select {
		case <-done:
			return
		case <-l.quit:
			return
		case <-tick.C:
		}
		if l.reachable() == nil {
			s := l.s
			s.mu.Lock()
			if cur := s.held[h.sk]; cur == h || (l.flaw == blindRenewal && cur != nil) {
				cur.expires = time.Now().Add(h.ttl)
				lastOK = time.Now()
			}
			s.mu.Unlock()
			continue
		}
		l.mu.Lock()
		dead := l.dead
		l.mu.Unlock()
		if dead {
			return
		}
		if time.Since(lastOK) > h.ttl*3/4 && l.flaw != silentLoss {
			h.st.End(locker.KeyError("renew", h.key, locker.ErrLost))
			return
		}
	}
}

func (h *toyHandle) Key() string           { return h.key }
func (h *toyHandle) Token() int64          { return h.token }
func (h *toyHandle) Done() <-chan struct{} { return h.st.Done() }
func (h *toyHandle) Err() error            { return h.st.Err() }

func (h *toyHandle) Release(ctx context.Context) error {
	s := h.l.s
	switch h.l.flaw {
	case blindRelease:
		s.mu.Lock()
		delete(s.held, h.sk) // whoever holds it now
		s.changedLocked()
		s.mu.Unlock()
		h.st.End(locker.ErrReleased)
		return nil
	case ownerPerLocker:
		// Compare-and-delete, but with the Locker as the owner: a stale
		// handle matches the same Locker's newer lock.
		s.mu.Lock()
		if cur := s.held[h.sk]; cur != nil && cur.l == h.l {
			delete(s.held, h.sk)
			s.changedLocked()
		}
		s.mu.Unlock()
		if err := h.st.Err(); err != nil {
			return locker.KeyError("release", h.key, err)
		}
		h.st.End(locker.ErrReleased)
		return nil
	}
	if h.l.flaw == racyRelease {
		// Check, then act a slow round trip later: concurrent calls all
		// pass the check (the delay is long enough for that on a loaded
		// machine).
		if err := h.st.Err(); err != nil {
			return locker.KeyError("release", h.key, err)
		}
		time.Sleep(200 * time.Millisecond)
	} else {
		h.relMu.Lock()
		defer h.relMu.Unlock()
		if err := h.st.Err(); err != nil {
			return locker.KeyError("release", h.key, err)
		}
	}
	for h.l.flaw == releaseIgnoresCtx && h.l.isCut() {
		time.Sleep(10 * time.Millisecond) // retry until the store answers, whatever ctx says
	}
	if err := h.l.reachable(); err != nil && !errors.Is(err, locker.ErrClosed) {
		// Give the lock up all the same: stop renewing, and let the lease
		// run out in the store.
		h.l.mu.Lock()
		delete(h.l.handles, h)
		h.l.mu.Unlock()
		h.st.End(locker.ErrReleased)
		return locker.KeyError("release", h.key, fmt.Errorf("%w (given up; the lease runs out)", err))
	}
	s.mu.Lock()
	ours := s.held[h.sk] == h
	if ours {
		delete(s.held, h.sk)
		s.changedLocked()
	}
	s.mu.Unlock()
	h.l.mu.Lock()
	delete(h.l.handles, h)
	h.l.mu.Unlock()
	if !ours {
		h.st.End(locker.KeyError("release", h.key, locker.ErrLost))
		return locker.KeyError("release", h.key, locker.ErrLost)
	}
	h.st.End(locker.ErrReleased)
	return nil
}

func (l *toyLocker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.quit)
	hs := l.handles
	l.handles = nil
	l.mu.Unlock()
	s := l.s
	s.mu.Lock()
	for h := range hs {
		if s.held[h.sk] == h && !l.dead && l.flaw != closeKeepsLocks {
			delete(s.held, h.sk)
		}
		h.st.End(locker.KeyError("close", h.key, fmt.Errorf("%w by Close (%w)", locker.ErrReleased, locker.ErrClosed)))
	}
	s.changedLocked()
	s.mu.Unlock()
	l.wg.Wait()
	return nil
}

func (l *toyLocker) isCut() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cut
}

// crash: stop renewing, keep the locks in the store until they expire.
func (l *toyLocker) crash() {
	l.mu.Lock()
	l.dead = true
	l.mu.Unlock()
}

func (l *toyLocker) setCut(v bool) {
	l.mu.Lock()
	l.cut = v
	l.mu.Unlock()
}
