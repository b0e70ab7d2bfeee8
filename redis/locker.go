package redis

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
)

var _ locker.Locker = (*Locker)(nil)

// Locker takes locks on one Redis deployment (a single server, a Sentinel
// failover group or a Cluster). It is safe for concurrent use. Make it with
// New or locker.Open, and Close it when done.
type Locker struct {
	client    goredis.UniversalClient
	ownClient bool // opened from a URL: Close closes the client too
	cfg       config
	cfgErr    error // an invalid Option, reported by every acquire
	sharded   bool  // Cluster: sharded Pub/Sub (SPUBLISH/SSUBSCRIBE)
	hub       *hub
	policies  policyCache // which servers were found not to evict keys
	unbounded bool        // the client has no ReadTimeout: see requestTimeout

	// ctx ends when Close begins: every request in flight is abandoned
	// (see exec), and every call returns locker.ErrClosed.
	ctx     context.Context
	stop    context.CancelFunc
	closing <-chan struct{} // ctx.Done(): waiters give up

	mu      sync.Mutex
	closed  bool
	handles map[*Handle]struct{} // held locks, for Close

	// active counts calls in progress and goroutines that may still talk to
	// Redis (watchdogs, requests, clean-ups); Close waits for them, boundedly.
	active tracker
}

// New returns a Locker that takes locks through client, which may be a
// *goredis.Client (single server, or Sentinel through NewFailoverClient) or a
// *goredis.ClusterClient. The Locker does not close client: the caller keeps
// owning it and must close it after the Locker.
//
// Every call returns when its context ends or the Locker closes, whatever
// the client's settings. A request it abandons that way occupies a
// connection until it ends on its own, at its socket deadline: the client's
// ReadTimeout, and with ContextTimeoutEnabled also the context's deadline
// (or 30s when the client has no ReadTimeout). Set ContextTimeoutEnabled:
// without it a deadline does not reach the socket. *goredis.Ring is not
// supported: it moves keys between shards when one fails, which would let
// two clients hold one lock.
func New(client goredis.UniversalClient, opts ...Option) *Locker {
	cfg, cfgErr := newConfig(opts)
	ctx, stop := context.WithCancel(context.Background())
	l := &Locker{
		client:   client,
		cfg:      cfg,
		cfgErr:   cfgErr,
		ctx:      ctx,
		stop:     stop,
		closing:  ctx.Done(),
		handles:  map[*Handle]struct{}{},
		policies: policyCache{ok: map[string]time.Time{}},
	}
	switch c := client.(type) {
	case *goredis.ClusterClient:
		l.sharded = true
		l.unbounded = c.Options().ReadTimeout < 0
	case *goredis.Client:
		l.unbounded = c.Options().ReadTimeout < 0
	case *goredis.Ring:
		if l.cfgErr == nil {
			l.cfgErr = fmt.Errorf("%w: redis: *goredis.Ring is not supported: it remaps keys to other shards when one fails, so two clients could hold one lock; use a single server, Sentinel or Cluster", locker.ErrInvalidOption)
		}
	case nil:
		if l.cfgErr == nil {
			l.cfgErr = errNilClient
		}
	}
	l.hub = newHub(l)
	return l
}

var errNilClient = fmt.Errorf("%w: redis: nil client", locker.ErrInvalidOption)

// keys are the Redis names of one lock.
type keys struct {
	lock     string // holds the owner token while locked; expires with the lease
	fence    string // the fencing counter; never expires (see WithFenceExpiry)
	wake     string // Pub/Sub channel announcing releases
	released string // the owner token of the last release, for a few seconds
}

// keysFor encodes a user key injectively: base64url of its bytes, which
// contains neither braces nor ':' , inside a Cluster hash tag, so the names
// of one key share one slot, and no two user keys share any name.
func (l *Locker) keysFor(key string) keys {
	tag := l.cfg.prefix + "{" + base64.RawURLEncoding.EncodeToString([]byte(key)) + "}"
	return keys{lock: tag + ":lock", fence: tag + ":fence", wake: tag + ":wake", released: tag + ":released"}
}

// KeyNames returns the names under which the Locker keeps key in Redis, as
// "How it works" in the package documentation lays them out: the lock
// (a string holding the holder's owner token, see Handle.Owner, that expires
// with the lease), the fencing counter (an integer that never expires) and
// the Pub/Sub channel on which releases are announced. It is for operators
// and tests: inspecting a lock or deleting a stuck one by hand, finding a
// key's Cluster slot, watching its releases, writing ACLs. Never delete or
// overwrite the fence counter: tokens would start again (see "Fencing tokens
// and persistence"). A fourth name, the lock's with ":released" in place of
// ":lock", remembers the last release for a few seconds (see "How it
// works"). KeyNames neither validates key nor talks to Redis.
func (l *Locker) KeyNames(key string) (lock, fence, wake string) {
	k := l.keysFor(key)
	return k.lock, k.fence, k.wake
}

// newOwner returns a random owner token: 128 bits, so that no two holders,
// in any process, ever carry the same one.
func newOwner() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// TryAcquire makes one attempt to take key. When another holder has it the
// error wraps locker.ErrNotAcquired.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	h, err := l.acquire(ctx, "try-acquire", key, opts, false)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// Acquire takes key, waiting as long as ctx allows while another holder has
// it. It sleeps until the holder releases (a Pub/Sub notification), the
// holder's lease runs out, or the retry interval passes, then tries again.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	h, err := l.acquire(ctx, "acquire", key, opts, true)
	if err != nil {
		return nil, err
	}
	return h, nil
}

func (l *Locker) acquire(ctx context.Context, op, key string, opts []locker.Option, wait bool) (*Handle, error) {
	if err := locker.ValidateKey(key); err != nil {
		return nil, locker.KeyError(op, key, err)
	}
	if l.cfgErr != nil {
		return nil, locker.KeyError(op, key, l.cfgErr)
	}
	ttl, err := l.cfg.lockTTL(opts)
	if err != nil {
		return nil, locker.KeyError(op, key, err)
	}
	drift, err := l.cfg.driftFor(ttl)
	if err != nil {
		return nil, locker.KeyError(op, key, err)
	}
	if !l.enter() {
		return nil, locker.KeyError(op, key, locker.ErrClosed)
	}
	defer l.exit()
	if ctx.Err() != nil {
		return nil, locker.KeyError(op, key, ctxErr(ctx))
	}
	k := l.keysFor(key)
	if err := l.checkPolicy(ctx, k); err != nil {
		return nil, locker.KeyError(op, key, err)
	}

	// Try first: an uncontended lock costs one round trip and no
	// subscription.
	h, res, err := l.tryOnce(ctx, key, k, ttl, drift)
	if err != nil || h != nil {
		return h, locker.KeyError(op, key, err)
	}
	if !wait {
		return nil, locker.KeyError(op, key, locker.ErrNotAcquired)
	}

	// Subscribe, then try again before sleeping: a release that happened
	// between the first try and the subscription would otherwise go
	// unheard until the retry interval.
	w := l.hub.watch(ctx, k.wake)
	acquired := false
	defer func() { w.leave(!acquired) }()
	if err := w.awaitSubscribed(ctx, l.closing, l.cfg.retryInterval); err != nil {
		return nil, locker.KeyError(op, key, err)
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		h, res, err = l.tryOnce(ctx, key, k, ttl, drift)
		if err != nil {
			return nil, locker.KeyError(op, key, err)
		}
		if h != nil {
			acquired = true
			return h, nil
		}
		if w.hasMoved() {
			// The key's slot moved to another Cluster master: listen
			// there, then try again before sleeping, as above.
			w = l.hub.rewatch(ctx, l.closing, w)
			if err := w.awaitSubscribed(ctx, l.closing, l.cfg.retryInterval); err != nil {
				return nil, locker.KeyError(op, key, err)
			}
			continue
		}
		timer.Reset(l.sleepFor(res.pttl))
		select {
		case <-w.wake:
		case <-timer.C:
		case <-ctx.Done():
			return nil, locker.KeyError(op, key, ctxErr(ctx))
		case <-l.closing:
			return nil, locker.KeyError(op, key, locker.ErrClosed)
		}
	}
}

// sleepFor is how long a waiter sleeps after a failed attempt: until the
// holder's lease runs out (plus a millisecond, as Redis expires a key only
// once its deadline has passed), but no longer than the retry interval.
func (l *Locker) sleepFor(pttl time.Duration) time.Duration {
	d := l.cfg.retryInterval
	if pttl >= 0 && pttl+time.Millisecond < d {
		d = pttl + time.Millisecond
	}
	return d
}

// tryOnce makes one attempt. It returns the new Handle, or the holder's
// remaining lease when another client holds key.
func (l *Locker) tryOnce(ctx context.Context, key string, k keys, ttl, drift time.Duration) (*Handle, acquireResult, error) {
	owner := newOwner()
	start := time.Now() // the lease starts no earlier than the request leaves
	var res acquireResult
	err := l.exec(ctx, func(ctx context.Context) error {
		var err error
		res, err = l.runAcquire(ctx, k, owner, ttl)
		return err
	}, func() {
		// The request was abandoned (ctx ended) but may have reached the
		// server: remove the lock it may have taken, so that a cancelled
		// Acquire leaves nothing behind.
		l.cleanup(k, owner)
	})
	if err != nil {
		return nil, acquireResult{}, err // res may still be written to
	}
	if !res.ok {
		return nil, res, nil
	}
	h := newHandle(l, key, k, owner, res.token, ttl, drift, start)
	if !l.register(h) {
		// Close ran while we were acquiring: give the lock back.
		l.cleanup(k, owner)
		return nil, acquireResult{}, locker.ErrClosed
	}
	h.start()
	return h, res, nil
}

func (l *Locker) register(h *Handle) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.handles[h] = struct{}{}
	return true
}

func (l *Locker) unregister(h *Handle) {
	l.mu.Lock()
	delete(l.handles, h)
	l.mu.Unlock()
}

// cleanupTimeout bounds the best-effort deletes of locks nobody holds any
// more (abandoned acquires, lost leases); the lease ends them anyway.
const cleanupTimeout = 5 * time.Second

// cleanup deletes k's lock if it still carries owner, in the background.
// It must run inside an active call or goroutine. It outlives the start of
// Close (which waits for it, boundedly): an abandoned acquire that went
// through must not leave a lock behind for its whole TTL.
func (l *Locker) cleanup(k keys, owner string) {
	l.active.add()
	go func() {
		defer l.active.done()
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		_, _ = l.runRelease(ctx, k, owner)
	}()
}

// closeGrace is how long Close waits for requests still in flight and for
// the clean-ups of the acquires it interrupted. A request that has reached a
// healthy server ends within a round trip; one stuck on a dead connection
// cannot be stopped from outside go-redis (see exec), and Close does not wait
// for it longer than this.
const closeGrace = 250 * time.Millisecond

// Close releases every lock the Locker holds (their Handles report
// locker.ErrReleasedByClose), stops the watchdogs and the Pub/Sub
// connections, and ends every call in progress with locker.ErrClosed at
// once: waiting Acquires, and calls whose request is in flight, which it
// abandons. It closes the client only when the Locker was opened from a URL.
//
// It waits for the release of the held locks (at most locker.ReleaseTimeout
// when the server does not answer), then at most 250ms for requests still in
// flight. A request stuck on a dead connection ends when the client is
// closed or at its socket deadline (see New); its goroutine may outlive
// Close until then, but it has no effect: whatever it may have taken on the
// server is deleted when it ends. When the Locker owns the client (Open),
// Close closes it, which ends them at once.
// A second Close returns nil.
func (l *Locker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	held := make([]*Handle, 0, len(l.handles))
	for h := range l.handles {
		held = append(held, h)
	}
	clear(l.handles)
	l.mu.Unlock()

	l.stop() // every call in progress returns ErrClosed now
	err := l.releaseAll(held)
	l.hub.close()
	l.active.wait(closeGrace)
	if l.ownClient {
		// Closing the client ends whatever request is still stuck, so that
		// no goroutine of ours outlives Close.
		err = errors.Join(err, l.client.Close())
		l.active.wait(-1)
	}
	return err
}

// releaseAll gives up held in one pipeline: one round trip however many
// locks the Locker holds.
func (l *Locker) releaseAll(held []*Handle) error {
	if len(held) == 0 {
		return nil
	}
	for _, h := range held {
		h.stopRenewal()
	}
	// Bounded as a Release by locker.Do is, and as the postgres Locker's
	// Close is. Not bounded by the Locker's own context, which has ended.
	ctx, cancel := context.WithTimeout(context.Background(), locker.ReleaseTimeout)
	defer cancel()
	var cmds []*goredis.Cmd
	err := l.detach(ctx, context.Background(), func(ctx context.Context) error {
		pipe := l.client.Pipeline()
		cmds = make([]*goredis.Cmd, len(held))
		for i, h := range held {
			// EVAL, not EVALSHA: a pipeline cannot fall back on NOSCRIPT.
			cmds[i] = releaseScript.Eval(ctx, pipe, h.k.releaseKeys(), l.releaseArgs(h.owner)...)
		}
		_, _ = pipe.Exec(ctx) // each command's error is read below
		return nil
	}, nil)
	if err != nil {
		// The pipeline is abandoned: its results are not ours to read.
		var errs []error
		for _, h := range held {
			h.end(locker.ErrReleasedByClose)
			errs = append(errs, locker.KeyError("release", h.key, fmt.Errorf("%w (the lock expires after its TTL)", err)))
		}
		return errors.Join(errs...)
	}
	var errs []error
	for i, h := range held {
		n, err := cmds[i].Int64()
		switch {
		case err != nil:
			h.end(locker.ErrReleasedByClose)
			errs = append(errs, locker.KeyError("release", h.key, fmt.Errorf("%w (the lock expires after its TTL)", err)))
		case n == 1:
			h.end(locker.ErrReleasedByClose)
		default:
			h.end(h.lostErr("released by Close, but the lease had already run out"))
		}
	}
	return errors.Join(errs...)
}
