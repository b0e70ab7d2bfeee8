package conformance_test

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/lease"
)

// toy is a small in-memory Locker that the suite's own tests break on
// purpose, one flaw at a time, to prove that Run catches each flaw. Without
// flaws it keeps the contract, which proves the failures come from the flaws.
// It is deliberately simple; memlock is the reference backend.

type flaw int

const (
	noFlaw         flaw = iota
	noExclusion         // every attempt succeeds
	constantToken       // every holder gets token 1
	blindRelease        // Release deletes whoever holds the key
	ignoresContext      // waits ignore ctx
	silentLoss          // a lost lock never closes Done
)

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
	token   int64
	ttl     time.Duration
	expires time.Time // guarded by s.mu
	st      *lease.State
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

// try makes one attempt; on failure it returns the channel that signals the
// next change and when the current lease runs out.
func (l *toyLocker) try(key string, ttl time.Duration) (*toyHandle, <-chan struct{}, time.Time, error) {
	if err := l.reachable(); err != nil {
		return nil, nil, time.Time{}, err
	}
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if cur := s.held[key]; cur != nil && l.flaw != noExclusion {
		if now.Before(cur.expires) {
			return nil, s.wake, cur.expires, nil
		}
		// The lease ran out: the old holder must know before we take over.
		if l.flaw != silentLoss {
			cur.st.End(locker.KeyError("renew", key, locker.ErrLost))
		}
	}
	s.fence[key]++
	h := &toyHandle{l: l, key: key, token: s.fence[key], ttl: ttl, expires: now.Add(ttl), st: lease.New()}
	if l.flaw == constantToken {
		h.token = 1
	}
	l.mu.Lock()
	if l.closed { // Close ran since reachable(): take nothing
		l.mu.Unlock()
		return nil, nil, time.Time{}, locker.ErrClosed
	}
	l.handles[h] = struct{}{}
	l.mu.Unlock()
	s.held[key] = h
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
	for {
		h, wake, expires, err := l.try(key, o.TTL)
		if err != nil || h != nil {
			return h, err
		}
		if !wait {
			return nil, locker.KeyError("try-acquire", key, locker.ErrNotAcquired)
		}
		timer := time.NewTimer(time.Until(expires))
		done := ctx.Done()
		if l.flaw == ignoresContext {
			done = nil
		}
		select {
		case <-wake:
		case <-timer.C:
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
		select {
		case <-h.st.Done():
			return
		case <-l.quit:
			return
		case <-tick.C:
		}
		if l.reachable() == nil {
			s := l.s
			s.mu.Lock()
			if s.held[h.key] == h {
				h.expires = time.Now().Add(h.ttl)
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
	if h.l.flaw == blindRelease {
		s := h.l.s
		s.mu.Lock()
		delete(s.held, h.key) // whoever holds it now
		s.changedLocked()
		s.mu.Unlock()
		h.st.End(locker.ErrReleased)
		return nil
	}
	if err := h.st.Err(); err != nil {
		return locker.KeyError("release", h.key, err)
	}
	if err := h.l.reachable(); err != nil && !errors.Is(err, locker.ErrClosed) {
		return locker.KeyError("release", h.key, err)
	}
	s := h.l.s
	s.mu.Lock()
	ours := s.held[h.key] == h
	if ours {
		delete(s.held, h.key)
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
		if s.held[h.key] == h && !l.dead {
			delete(s.held, h.key)
		}
		h.st.End(locker.KeyError("close", h.key, locker.ErrClosed))
	}
	s.changedLocked()
	s.mu.Unlock()
	l.wg.Wait()
	return nil
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
