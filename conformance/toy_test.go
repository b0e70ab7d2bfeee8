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
	noFlaw                  flaw = iota
	noExclusion                  // every attempt succeeds
	constantToken                // every holder gets token 1
	perLockerToken               // tokens count per Locker, not per key across Lockers
	blindRelease                 // Release deletes whoever holds the key
	ownerPerLocker               // Release compares the holder's Locker, not the acquisition, and asks the store first
	ignoresContext               // waits ignore ctx
	silentLoss                   // a lost lock never closes Done
	tryWaits                     // TryAcquire waits up to a second for the key
	pollingWaiter                // waiters sleep 2s between attempts instead of being woken
	truncatedKeys                // keys are cut to 250 bytes in the store
	closeKeepsLocks              // Close ends its handles but leaves their keys to expire
	releaseIgnoresCtx            // a Release that cannot reach the store waits for it, ignoring ctx
	racyRelease                  // concurrent Releases of one handle are not serialised
	blindRenewal                 // the watchdog outlives Release and renews whoever holds the key
	retriesUnreachable           // Acquire and TryAcquire retry until the store answers, ignoring ctx
	checkedBlindRelease          // Release checks its own handle, then deletes whoever holds the key
	checkedBlindRenewal          // the watchdog renews whoever holds the key while its own handle lives
	processLocal                 // locks within the process only, but does not say so (Harness.InProcess)
	racyTry                      // TryAcquire checks, then sets a moment later
	outageNotAcquired            // an unreachable store is reported as ErrNotAcquired
	failedReleaseNil             // a Release that could not reach the store returns nil
	lateCtx                      // waits notice their context only every 2.5s
	lostWakeup                   // a change wakes one waiter only, even one that has gone
	closeWaitsInFlight           // Close waits for requests in flight instead of interrupting them
	acceptsPrivateStore          // a Locker with a store of its own (a temporary schema's like) is accepted
	faultGrantsWaiter            // a waiter woken by another waiter's crash or cut takes the key, held or not
	strandsCutWaiter             // a waiter whose Locker was cut off waits until its ctx ends, whatever happens
	resetFreesSilently           // a reset of its connections frees the Locker's keys, its handles unaware
	sessionResetSilent           // the same, on a harness that declares its locks end with their connection (ResetEndsLocks)
	dropsCause                   // a call its context ended reports ctx.Err() without the cause
	refusesLongTTL               // a TTL above an hour, inside the portable range, is refused
	roundsLeaseUp                // the lease given (and reported) is the TTL asked plus a second
	ownDefaultTTL                // a lock taken without WithTTL gets 10s, not locker.DefaultTTL
	outlivesLease                // the store keeps a silent holder's lock 3× the lease reported
	inspectNoLease               // Inspect reports the remaining lease but not the full one
	ownerLingers                 // a holder that gave no owner shows the previous holder's
	closeCutClaimsRelease        // Close while cut off says its locks were released, and returns nil
	ignoresBadTTL                // a refused WithTTL is ignored: the call goes on with the default
	ignoresTokenBase             // the token base is accepted and never added
	floorsTokenBase              // the token base is a floor, max(base, token), not an offset
	inspectIgnoresTokenBase      // Handle.Token has the base, Inspect's token has not
	acceptsBadTokenBase          // a negative token base, or one above locker.MaxTokenBase, is accepted
	sharedRenewalFate            // a renewal that finds one lock taken away ends every lock of the Locker (a batch's verdict for all)
)

// errToyPrivate is the toy's refusal of a store private to one Locker, the
// like of a temporary SQL schema: every client would lock in a keyspace of
// its own.
var errToyPrivate = fmt.Errorf("%w: toy: store=private gives every Locker a keyspace of its own; use store=shared", locker.ErrUnsafeConfig)

// toyMaxStoredKey is where truncatedKeys cuts keys, as a VARCHAR(250) would.
const toyMaxStoredKey = 250

type toyStore struct {
	mu      sync.Mutex
	held    map[string]*toyHandle
	fence   map[string]int64
	wake    chan struct{}     // closed and replaced on every change
	waiters []chan struct{}   // for lostWakeup: one is woken per change
	oneWake bool              // lostWakeup
	faults  int               // for faultGrantsWaiter: crashes and cuts so far
	owners  map[string]string // for ownerLingers: the last owner given per key
}

func newToyStore() *toyStore {
	return &toyStore{held: map[string]*toyHandle{}, fence: map[string]int64{}, wake: make(chan struct{}), owners: map[string]string{}}
}

// changedLocked wakes every waiter (or, with lostWakeup, the first in line);
// s.mu must be held.
func (s *toyStore) changedLocked() {
	if s.oneWake {
		if len(s.waiters) > 0 {
			close(s.waiters[0])
			s.waiters = s.waiters[1:]
		}
		return
	}
	close(s.wake)
	s.wake = make(chan struct{})
}

// waitChanLocked returns the channel that signals the next change for one
// waiter; s.mu must be held.
func (s *toyStore) waitChanLocked() chan struct{} {
	if s.oneWake {
		ch := make(chan struct{})
		s.waiters = append(s.waiters, ch)
		return ch
	}
	return s.wake
}

// steal takes h's lock away without telling h, as an operator would.
func (s *toyStore) steal(h *toyHandle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[h.sk] == h {
		delete(s.held, h.sk)
		s.changedLocked()
	}
}

type toyLocker struct {
	s    *toyStore
	flaw flaw
	base int64 // the token base

	mu      sync.Mutex
	closed  bool
	cut     bool
	healed  chan struct{} // closed when a cut heals
	dead    bool
	tokens  int64 // for perLockerToken
	cuts    int   // for strandsCutWaiter: cuts so far
	handles map[*toyHandle]struct{}
	quit    chan struct{} // closed by Close: ends waits and watchdogs
	wg      sync.WaitGroup
}

func newToy(s *toyStore, f flaw) *toyLocker {
	if f == lostWakeup {
		s.mu.Lock()
		s.oneWake = true
		s.mu.Unlock()
	}
	return &toyLocker{s: s, flaw: f, handles: map[*toyHandle]struct{}{}, quit: make(chan struct{})}
}

type toyHandle struct {
	l       *toyLocker
	key     string
	sk      string // the key in the store
	token   int64
	ttl     time.Duration
	owner   string    // locker.WithOwner's
	expires time.Time // guarded by s.mu
	st      *backend.State
	relMu   sync.Mutex // serialises Release
}

// toyTTL is the toy's default lease; ownDefaultTTL uses its own.
const toyTTL = locker.DefaultTTL

var errUnreachable = errors.New("toy: backend unreachable")

// reachable says whether a request would reach the store now, without
// waiting: nil, ErrClosed, or errUnreachable.
func (l *toyLocker) reachable() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return locker.ErrClosed
	case l.cut || l.dead:
		return errUnreachable
	}
	return nil
}

// reach is a request's trip to the store: while cut off it hangs, as in a
// partition, until the cut heals, ctx ends or the Locker closes (the
// closeWaitsInFlight flaw ignores Close). A dead Locker fails at once.
func (l *toyLocker) reach(ctx context.Context) error {
	for {
		l.mu.Lock()
		closed, cut, dead, healed := l.closed, l.cut, l.dead, l.healed
		l.mu.Unlock()
		switch {
		case closed:
			return locker.ErrClosed
		case dead:
			return errUnreachable
		case !cut:
			return nil
		}
		quit := l.quit
		if l.flaw == closeWaitsInFlight {
			quit = nil
		}
		done := ctx.Done()
		if l.flaw == retriesUnreachable {
			done = nil // wait for the store, whatever ctx says
		}
		select {
		case <-healed:
		case <-quit:
		case <-done:
			return fmt.Errorf("%w: %w", errUnreachable, ctx.Err())
		}
	}
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
func (l *toyLocker) try(ctx context.Context, key string, ttl time.Duration, owner string, force bool) (*toyHandle, <-chan struct{}, time.Time, error) {
	if l.flaw == outageNotAcquired && l.reachable() != nil && l.isCut() {
		return nil, nil, time.Time{}, locker.ErrNotAcquired
	}
	if err := l.reach(ctx); err != nil {
		return nil, nil, time.Time{}, err
	}
	sk := l.storeKey(key)
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if l.flaw == racyTry {
		// Check, then set a moment later: concurrent callers all pass.
		free := s.held[sk] == nil || !now.Before(s.held[sk].expires)
		s.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		s.mu.Lock()
		if free {
			delete(s.held, sk)
		}
	}
	if cur := s.held[sk]; cur != nil && l.flaw != noExclusion && !force {
		if now.Before(cur.expires) {
			return nil, s.waitChanLocked(), cur.expires, nil
		}
		// The lease ran out: the old holder must know before we take over.
		if l.flaw != silentLoss {
			cur.st.End(backend.KeyError("renew", cur.key, locker.ErrLost))
		}
	}
	s.fence[sk]++
	if l.flaw == ownerLingers {
		// Like a companion field that only a holder with an owner writes.
		if owner == "" {
			owner = s.owners[sk]
		}
		s.owners[sk] = owner
	}
	h := &toyHandle{l: l, key: key, sk: sk, token: s.fence[sk], ttl: ttl, owner: owner, expires: now.Add(l.storeLease(ttl)), st: backend.NewState()}
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
	o, err := backend.ApplyOptions(opts...)
	if err != nil && l.flaw != ignoresBadTTL {
		return nil, err
	}
	switch {
	case o.TTL == 0 && l.flaw == ownDefaultTTL:
		o.TTL = 10 * time.Second
	case o.TTL == 0:
		o.TTL = toyTTL
	case o.TTL > time.Hour && l.flaw == refusesLongTTL:
		return nil, backend.KeyError("acquire", key, fmt.Errorf("%w: toy: TTL %v is above an hour", locker.ErrInvalidOption, o.TTL))
	case l.flaw == roundsLeaseUp:
		o.TTL += time.Second
	}
	if ctx.Err() != nil {
		return nil, l.ctxErr(ctx)
	}
	var giveUp <-chan time.Time // for tryWaits
	if !wait && l.flaw == tryWaits {
		giveUp = time.After(time.Second)
	}
	op := "acquire"
	if !wait {
		op = "try-acquire"
	}
	force := false // faultGrantsWaiter
	l.mu.Lock()
	cuts := l.cuts // strandsCutWaiter
	l.mu.Unlock()
	for {
		h, wake, expires, err := l.try(ctx, key, o.TTL, o.Owner, force)
		if err != nil {
			return nil, backend.KeyError(op, key, err)
		}
		if h != nil {
			return h, nil
		}
		if !wait && giveUp == nil {
			return nil, backend.KeyError("try-acquire", key, locker.ErrNotAcquired)
		}
		l.s.mu.Lock()
		faults := l.s.faults
		l.s.mu.Unlock()
		timer := time.NewTimer(time.Until(expires))
		if l.flaw == pollingWaiter {
			wake = nil
			timer.Reset(2 * time.Second)
		}
		done := ctx.Done()
		if l.flaw == ignoresContext {
			done = nil
		}
		var poll <-chan time.Time
		if l.flaw == lateCtx {
			done = nil
			poll = time.After(2500 * time.Millisecond)
		}
		select {
		case <-poll:
			if ctx.Err() != nil {
				timer.Stop()
				return nil, backend.KeyError("acquire", key, l.ctxErr(ctx))
			}
		case <-wake:
		case <-timer.C:
		case <-giveUp:
			timer.Stop()
			return nil, backend.KeyError("try-acquire", key, locker.ErrNotAcquired)
		case <-l.quit:
			timer.Stop()
			return nil, backend.KeyError("acquire", key, locker.ErrClosed)
		case <-done:
			timer.Stop()
			return nil, backend.KeyError("acquire", key, l.ctxErr(ctx))
		}
		timer.Stop()
		l.mu.Lock()
		stranded := l.flaw == strandsCutWaiter && l.cuts != cuts
		l.mu.Unlock()
		if stranded {
			select { // its claim went with the cut; nothing will wake it
			case <-ctx.Done():
				return nil, backend.KeyError("acquire", key, l.ctxErr(ctx))
			case <-l.quit:
				return nil, backend.KeyError("acquire", key, locker.ErrClosed)
			}
		}
		if l.flaw == faultGrantsWaiter {
			l.s.mu.Lock()
			force = l.s.faults != faults
			l.s.mu.Unlock()
		}
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
			cur := s.held[h.sk]
			blind := l.flaw == blindRenewal || l.flaw == checkedBlindRenewal
			if cur == h || (blind && cur != nil) {
				cur.expires = time.Now().Add(l.storeLease(h.ttl))
				lastOK = time.Now()
			}
			s.mu.Unlock()
			if cur != h && !blind && l.flaw != silentLoss {
				// Compare-and-renew found another owner: the lock was taken
				// away, and the holder hears of it now.
				h.st.End(backend.KeyError("renew", h.key, locker.ErrLost))
				if l.flaw == sharedRenewalFate {
					l.mu.Lock()
					for o := range l.handles {
						o.st.End(backend.KeyError("renew", o.key, locker.ErrLost))
					}
					l.mu.Unlock()
				}
				return
			}
			continue
		}
		l.mu.Lock()
		dead := l.dead
		l.mu.Unlock()
		if dead {
			return
		}
		if time.Since(lastOK) > h.ttl*3/4 && l.flaw != silentLoss {
			h.st.End(backend.KeyError("renew", h.key, locker.ErrLost))
			return
		}
	}
}

func (h *toyHandle) Key() string           { return h.key }
func (h *toyHandle) Token() int64          { return h.l.token(h.token, true) }
func (h *toyHandle) Done() <-chan struct{} { return h.st.Done() }
func (h *toyHandle) Err() error            { return h.st.Err() }
func (h *toyHandle) TTL() time.Duration    { return h.ttl }

// token is the token the Locker reports for the store's token native:
// its base plus native; withBase false leaves the base out (Inspect, for
// inspectIgnoresTokenBase).
func (l *toyLocker) token(native int64, withBase bool) int64 {
	switch {
	case l.flaw == ignoresTokenBase || !withBase:
		return native
	case l.flaw == floorsTokenBase:
		return max(native, l.base)
	}
	return l.base + native
}

// newToyWithTokenBase is newToy with a token base, checked as
// backend.SetTokenBase checks it (acceptsBadTokenBase aside).
func newToyWithTokenBase(s *toyStore, f flaw, n int64) (*toyLocker, error) {
	var set backend.Settings
	if err := backend.SetTokenBase(n)(&set); err != nil && f != acceptsBadTokenBase {
		return nil, err
	}
	l := newToy(s, f)
	l.base = n
	return l, nil
}

// storeLease is how long the store keeps a lock of lease ttl after its
// holder's last word: ttl, or, with outlivesLease, three times that.
func (l *toyLocker) storeLease(ttl time.Duration) time.Duration {
	if l.flaw == outlivesLease {
		return 3 * ttl
	}
	return ttl
}

// Inspect is the toy's locker.Inspector: held while the lease in the store
// runs, with the holder's token, remaining and full lease.
func (l *toyLocker) Inspect(ctx context.Context, key string) (locker.LockInfo, error) {
	if err := locker.ValidateKey(key); err != nil {
		return locker.LockInfo{}, err
	}
	if err := l.reach(ctx); err != nil {
		return locker.LockInfo{}, backend.KeyError("inspect", key, err)
	}
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	info := locker.LockInfo{Key: key}
	if cur := s.held[l.storeKey(key)]; cur != nil && time.Now().Before(cur.expires) {
		info.Held, info.Token, info.TTL, info.Lease = true, l.token(cur.token, l.flaw != inspectIgnoresTokenBase), min(time.Until(cur.expires), cur.ttl), cur.ttl
		if l.flaw == inspectNoLease {
			info.Lease = 0
		}
		info.Owner = cur.owner
	}
	return info, nil
}

func (h *toyHandle) Release(ctx context.Context) error {
	s := h.l.s
	switch h.l.flaw {
	case blindRelease:
		s.mu.Lock()
		delete(s.held, h.sk) // whoever holds it now
		s.changedLocked()
		h.st.End(locker.ErrReleased) // before a watchdog tick can find the key gone
		s.mu.Unlock()
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
			return backend.KeyError("release", h.key, err)
		}
		h.st.End(locker.ErrReleased)
		return nil
	}
	if h.l.flaw == checkedBlindRelease {
		if err := h.st.Err(); err != nil {
			return backend.KeyError("release", h.key, err)
		}
		s.mu.Lock()
		delete(s.held, h.sk) // whoever holds it now
		s.changedLocked()
		h.st.End(locker.ErrReleased) // before a watchdog tick can find the key gone
		s.mu.Unlock()
		return nil
	}
	if h.l.flaw == racyRelease {
		// Check, then act a slow round trip later: concurrent calls all
		// pass the check (the delay is long enough for that on a loaded
		// machine).
		if err := h.st.Err(); err != nil {
			return backend.KeyError("release", h.key, err)
		}
		time.Sleep(200 * time.Millisecond)
	} else {
		h.relMu.Lock()
		defer h.relMu.Unlock()
		if err := h.st.Err(); err != nil {
			return backend.KeyError("release", h.key, err)
		}
	}
	for h.l.flaw == releaseIgnoresCtx && h.l.isCut() {
		time.Sleep(10 * time.Millisecond) // retry until the store answers, whatever ctx says
	}
	if err := h.l.reach(ctx); err != nil && !errors.Is(err, locker.ErrClosed) {
		// Give the lock up all the same: stop renewing, and let the lease
		// run out in the store.
		h.l.mu.Lock()
		delete(h.l.handles, h)
		h.l.mu.Unlock()
		h.st.End(locker.ErrReleased)
		if h.l.flaw == failedReleaseNil {
			return nil
		}
		return backend.KeyError("release", h.key, fmt.Errorf("%w (given up; the lease runs out)", err))
	}
	s.mu.Lock()
	ours := s.held[h.sk] == h
	if ours {
		delete(s.held, h.sk)
		s.changedLocked()
		// Ended before the store's lock is let go: a watchdog tick that
		// takes it next finds the key gone and must find the handle
		// released, not report the release as a loss (met in a CI
		// rehearsal on 8 Dec 2026: Loss/RenewalKeepsLock, "Err() after
		// Release = renew: lock lost").
		h.st.End(locker.ErrReleased)
	}
	s.mu.Unlock()
	h.l.mu.Lock()
	delete(h.l.handles, h)
	h.l.mu.Unlock()
	if !ours {
		h.st.End(backend.KeyError("release", h.key, locker.ErrLost))
		return backend.KeyError("release", h.key, locker.ErrLost)
	}
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
	cut := l.isCut()
	s := l.s
	s.mu.Lock()
	left := 0 // locks a cut-off toy cannot release: they stay until they expire
	for h := range hs {
		if cut && l.flaw != closeCutClaimsRelease {
			if h.st.End(backend.KeyError("close", h.key, fmt.Errorf("%w (%w): the store could not be reached to release it", locker.ErrLost, locker.ErrClosed))) {
				left++
			}
			continue
		}
		if s.held[h.sk] == h && !l.dead && !cut && l.flaw != closeKeepsLocks {
			delete(s.held, h.sk)
		}
		h.st.End(backend.KeyError("close", h.key, fmt.Errorf("%w by Close (%w)", locker.ErrReleased, locker.ErrClosed)))
	}
	s.changedLocked()
	s.mu.Unlock()
	l.wg.Wait()
	if left > 0 {
		return fmt.Errorf("toy: close: %d lock(s) left to expire: the store could not be reached", left)
	}
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
	l.fault()
}

// reset is the toy's Harness.Reset: its connections are closed. The toy
// keeps its locks through it (they live in the store, not in a connection),
// but resetFreesSilently frees them in the store and tells nobody.
func (l *toyLocker) reset() {
	if l.flaw != resetFreesSilently && l.flaw != sessionResetSilent {
		return
	}
	l.mu.Lock()
	var hs []*toyHandle
	for h := range l.handles {
		hs = append(hs, h)
	}
	l.mu.Unlock()
	l.s.mu.Lock()
	for _, h := range hs {
		if l.s.held[h.sk] == h {
			delete(l.s.held, h.sk)
		}
	}
	l.s.changedLocked()
	l.s.mu.Unlock()
}

// fault tells the store's waiters, for faultGrantsWaiter, that a client
// crashed or was cut off, as a session backend's queue does when a node goes.
func (l *toyLocker) fault() {
	if l.flaw != faultGrantsWaiter {
		return
	}
	l.s.mu.Lock()
	l.s.faults++
	l.s.changedLocked()
	l.s.mu.Unlock()
}

func (l *toyLocker) setCut(v bool) {
	l.mu.Lock()
	began := v && !l.cut
	switch {
	case began:
		l.healed = make(chan struct{})
		l.cuts++
	case !v && l.cut:
		close(l.healed)
	}
	l.cut = v
	l.mu.Unlock()
	if began {
		l.fault()
	}
}

// ctxErr is the error of a call that ctx ended; dropsCause loses the cause.
func (l *toyLocker) ctxErr(ctx context.Context) error {
	if l.flaw == dropsCause {
		return ctx.Err()
	}
	return backend.ContextError(ctx)
}
