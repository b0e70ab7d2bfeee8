package redis

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/lease"
	"github.com/go-locker/locker/redis/internal/guard"
	"github.com/go-locker/locker/redis/internal/releases"
)

var _ locker.Locker = (*Locker)(nil)

// Locker takes locks on one Redis deployment (a single server, a Sentinel
// failover group or a Cluster). It is safe for concurrent use. Make it with
// New or locker.Open, and Close it when done.
type Locker struct {
	client    goredis.UniversalClient
	ownClient bool // opened from a URL: Close closes the client too
	cfg       config
	sharded   bool // Cluster: sharded Pub/Sub (SPUBLISH/SSUBSCRIBE)
	hub       *hub
	id        string                  // random: names this Locker's queue entries and wake-up channels
	args      scriptArgs              // script arguments boxed once
	policies  *guard.Cache            // which servers were found not to evict keys
	unbounded bool                    // the client has no ReadTimeout: see requestTimeout
	deadlines bool                    // the client has ContextTimeoutEnabled: see inline
	inliner   goredis.UniversalClient // runs inline requests; nil: none run inline (see inline)
	slowUntil atomic.Int64            // UnixNano until which requests skip inline: see inline
	renewals  lease.Batcher[*Handle]  // sends the renewals in batches (renewMany)
	// slotBatches: a batch of keys of several slots was refused
	// (CROSSSLOT: a server in cluster mode behind a plain client), so
	// batches keep to one slot from then on.
	slotBatches atomic.Bool

	// life admits the calls, holds the handles for Close, and counts the
	// calls and goroutines that may still talk to Redis (requests,
	// renewals, clean-ups, Pub/Sub readers), which Close waits for,
	// boundedly. Its Closing context ends when Close begins: every request
	// in flight is abandoned (see exec), and every call returns
	// locker.ErrClosed. Its config error is an invalid Option or client,
	// reported by every call.
	life *backend.Life[*Handle]

	// enterFn and runFn are the handles' lease.Ops.Enter and
	// lease.RenewConfig.Go, made once: a func value of a method or a
	// closure allocates, and every acquisition would pay for them.
	enterFn func() (bool, func())
	runFn   func(func()) bool
}

// New returns a Locker that takes locks through client, which may be a
// *goredis.Client (single server, or Sentinel through NewFailoverClient) or a
// *goredis.ClusterClient. The Locker does not close client: the caller keeps
// owning it and must close it after the Locker.
//
// Every call returns when its context ends or the Locker closes, whatever
// the client's settings, within about 150ms (a request runs on the
// caller's goroutine until then, except on a *goredis.ClusterClient
// without ContextTimeoutEnabled; see the package documentation). A
// request it abandons that way occupies a
// connection until it ends on its own, at its socket deadline: the client's
// ReadTimeout, and with ContextTimeoutEnabled also the context's deadline
// (or 30s when the client has no ReadTimeout). Set ContextTimeoutEnabled:
// without it a deadline does not reach the socket. *goredis.Ring is not
// supported: it moves keys between shards when one fails, which would let
// two clients hold one lock.
func New(client goredis.UniversalClient, opts ...Option) *Locker {
	cfg, cfgErr := newConfig(opts)
	l := &Locker{
		client:   client,
		cfg:      cfg,
		policies: guard.NewCache(),
		id:       lease.NewOwner()[:16], // 96 bits
	}
	switch c := client.(type) {
	case *goredis.ClusterClient:
		l.sharded = true
		l.unbounded = noReadTimeout(c.Options().ReadTimeout)
		l.deadlines = c.Options().ContextTimeoutEnabled
		if l.deadlines {
			l.inliner = c
		}
	case *goredis.Client:
		l.unbounded = noReadTimeout(c.Options().ReadTimeout)
		l.deadlines = c.Options().ContextTimeoutEnabled
		l.inliner = c
		if !l.deadlines {
			l.inliner = c.WithTimeout(inlineTimeout(c.Options().ReadTimeout))
		}
	case *goredis.Ring:
		if cfgErr == nil {
			cfgErr = fmt.Errorf("%w: redis: *goredis.Ring is not supported: it remaps keys to other shards when one fails, so two clients could hold one lock; use a single server, Sentinel or Cluster", locker.ErrInvalidOption)
		}
	case nil:
		if cfgErr == nil {
			cfgErr = errNilClient
		}
	}
	if cfgErr == nil && client != nil {
		cfgErr = cfg.checkAck(client)
	}
	l.life = backend.NewLife[*Handle](cfgErr)
	l.renewals.Send, l.renewals.Go = l.renewMany, l.life.Go
	l.enterFn, l.runFn = lease.Counted(l.enter, l.exit), l.run
	l.initArgs()
	l.hub = newHub(l)
	return l
}

// noReadTimeout reports whether a client's ReadTimeout, as go-redis keeps it
// once the client is made, bounds no socket read: the user's -1 (no
// timeout) is kept as 0, and -2 (no deadline set at all) as -1.
func noReadTimeout(rt time.Duration) bool { return rt <= 0 }

var errNilClient = fmt.Errorf("%w: redis: nil client", locker.ErrInvalidOption)

// keys are the Redis names of one lock: a mutex's (keysFor), or a
// family's (famKeysFor; see families_scripts.go for their layout).
type keys struct {
	fam      family // which family's names these are
	lock     string // holds the owner token while locked; expires with the lease (a family's: its holders)
	leases   string // a family's holders by lease deadline; "" for the mutex
	limit    string // a semaphore's limit (also named, never written, for a reader-writer lock); "" for the mutex
	fence    string // the fencing counter; never expires (see WithFenceExpiry)
	released string // the owner tokens of the recent releases (see package releases)
	queue    string // the waiters' entries, by arrival (see luaQueue)
	waiters  string // the same entries, by deadline
	wakeBase string // a Locker's wake-up channel is wakeBase + its id
	wake     string // this Locker's wake-up channel for the key

	// argv is the mutex's names as script arguments (see evalsha), made
	// once per acquisition (see acquire) and shared by its acquire and
	// release; unset elsewhere (see args).
	argv keyArgs
}

// keyArgs is a mutex's names converted to interfaces once: converting a
// string to an interface allocates, and the acquire and release scripts
// name four keys each.
type keyArgs struct{ lock, fence, released, queue, waiters any }

// boxed returns k with argv filled in. It is for the caller's goroutine,
// before any request of the acquisition is made.
func (k keys) boxed() keys {
	k.argv = keyArgs{lock: k.lock, fence: k.fence, released: k.released, queue: k.queue, waiters: k.waiters}
	return k
}

// args returns the mutex's names as script arguments: argv when it is
// filled in, else made afresh. It never writes to k: a request runs on a
// goroutine that its caller may stop waiting for (see exec), and goes on
// after the caller has returned and reads k again (to leave the queue, to
// delete what the request may have taken); a name filled in by the request
// then would be a write nothing orders with those reads.
func (k *keys) args() *keyArgs {
	if k.argv.lock != nil {
		return &k.argv
	}
	return &keyArgs{lock: k.lock, fence: k.fence, released: k.released, queue: k.queue, waiters: k.waiters}
}

// keysFor encodes a user key injectively: base64url of its bytes, which
// contains neither braces nor ':' , inside a Cluster hash tag, so the names
// of one key share one slot, and no two user keys share any name.
//
// The names are cut from one string, built in one allocation: keysFor runs
// on every acquire.
func (l *Locker) keysFor(key string) keys {
	var stack [96]byte // the encoded key, on the stack unless the key is long
	tag := base64.RawURLEncoding.AppendEncode(stack[:0], []byte(key))
	tagLen := len(l.cfg.Prefix) + 2 + len(tag)
	suffixes := [...]string{":lock", ":fence", releases.Suffix, ":queue", ":waiters", ":wake:"}
	n := len(l.id)
	for _, s := range suffixes {
		n += tagLen + len(s)
	}
	var b strings.Builder
	b.Grow(n)
	var ends [len(suffixes)]int // where each name ends
	for i, s := range suffixes {
		b.WriteString(l.cfg.Prefix)
		b.WriteByte('{')
		b.Write(tag)
		b.WriteByte('}')
		b.WriteString(s)
		if i == len(suffixes)-1 {
			b.WriteString(l.id)
		}
		ends[i] = b.Len()
	}
	all := b.String() // no copy: one allocation for all the names
	name := func(i int) string {
		start := 0
		if i > 0 {
			start = ends[i-1]
		}
		return all[start:ends[i]]
	}
	wake := name(5)
	return keys{
		lock: name(0), fence: name(1), released: name(2), queue: name(3), waiters: name(4),
		wake: wake, wakeBase: wake[:len(wake)-len(l.id)],
	}
}

// KeyNames returns the names under which the Locker keeps key in Redis, as
// "How it works" in the package documentation lays them out: the lock
// (a string holding the holder's owner token, see Handle.Owner, that expires
// with the lease), the fencing counter (an integer that never expires) and
// the Pub/Sub channel on which this Locker is told that one of its waiters
// has its turn (each Locker has its own). It is for operators and tests:
// inspecting a lock or deleting a stuck one by hand, finding a key's
// Cluster slot, watching its handoffs, writing ACLs. Never delete or
// overwrite the fence counter: tokens would start again (see "Fencing tokens
// and persistence"). The other names of the key are the lock's with
// ":released-by:" followed by an owner token (a record of that owner's
// release, for a few seconds), ":queue" and ":waiters" (the waiters'
// queue) in place of ":lock" (see "How it works"). KeyNames neither
// validates key nor talks to Redis.
func (l *Locker) KeyNames(key string) (lock, fence, wake string) {
	k := l.keysFor(key)
	return k.lock, k.fence, k.wake
}

// TryAcquire makes one attempt to take key. When another holder has it the
// error wraps locker.ErrNotAcquired.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "try-acquire", key, mutexSpec, opts, false))
}

// Acquire takes key, waiting as long as ctx allows while another holder has
// it. Waiters are served in the order they came (see "Waiting" in the
// package documentation): a release tells the first live waiter, and only
// it, that its turn has come.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "acquire", key, mutexSpec, opts, true))
}

// acquire is Acquire (wait) and TryAcquire, of the mutex or of a family
// (spec), past admission: ctx, from Life.Enter, also ends when Close
// begins.
func (l *Locker) acquire(ctx context.Context, op, key string, spec famSpec, opts []locker.Option, wait bool) (*Handle, error) {
	ctx, done, err := l.life.Enter(ctx, op, key)
	if err != nil {
		return nil, err
	}
	defer done()
	ttl, err := l.cfg.LockTTL(opts)
	if err != nil {
		return nil, backend.KeyError(op, key, err)
	}
	drift, err := l.cfg.driftFor(ttl)
	if err != nil {
		return nil, backend.KeyError(op, key, err)
	}
	var k keys
	owner := lease.NewOwner()
	if spec.fam == famMutex {
		k = l.keysFor(key).boxed()
		owner = withDescription(owner, backend.Owner(opts))
	} else {
		k = l.famKeysFor(spec.fam, key)
		owner = string(spec.kind) + owner
	}
	if err := l.checkPolicy(ctx, k); err != nil {
		return nil, backend.KeyError(op, key, err)
	}
	// Everything the attempt's requests read is made here, on the caller's
	// goroutine: they write nothing of the attempt's (see keys.args).
	a := &attempt{l: l, key: key, k: k, owner: owner, oarg: owner, ttl: ttl, drift: drift, mode: modeTry, limit: spec.limit}
	if !wait {
		// One round trip; a TryAcquire never queues. A grant that came
		// back too late is given back and tried again, a few times.
		h, _, err := a.try(ctx)
		for n := 1; lease.IsLate(err) && n < lease.LateTries && ctx.Err() == nil; n++ {
			h, _, err = a.try(ctx)
		}
		if err != nil || h != nil {
			return h, backend.KeyError(op, key, permissionHint(err))
		}
		return nil, backend.KeyError(op, key, locker.ErrNotAcquired)
	}
	h, err := l.wait(ctx, a)
	if err != nil {
		return nil, backend.KeyError(op, key, permissionHint(err))
	}
	return h, nil
}

// permissionHint adds to an error of the server's ACLs where the rule the
// Locker needs is written: inside a script Redis names the script and its
// line, not the command refused.
func permissionHint(err error) error {
	if err == nil {
		return nil
	}
	if msg := err.Error(); strings.Contains(msg, "NOPERM") || strings.Contains(msg, "can't run this command") {
		return fmt.Errorf("%w (the Redis user lacks a right the Locker needs: see the ACL rule under \"Least privilege\" in the documentation of package redis)", err)
	}
	return err
}

// attempt is one Acquire or TryAcquire: every request it makes carries the
// same owner token, which is also its entry in the key's queue.
type attempt struct {
	l     *Locker
	key   string
	k     keys
	owner string
	ttl   time.Duration
	drift time.Duration
	mode  string // modeTry or modeWait
	limit int    // a semaphore's n; 0 otherwise
	// oarg is owner as a script argument, converted once for all the
	// attempt's requests and the Handle's release (see evalsha).
	oarg any
}

// run makes the attempt's request: the mutex's acquire script, or the
// families'.
func (a *attempt) run(ctx context.Context) (acquireResult, error) {
	if a.k.fam != famMutex {
		return a.l.runFamilyAcquire(ctx, a)
	}
	return a.l.runAcquire(ctx, &a.k, a.oarg, a.mode, a.ttl)
}

// tryFresh is try, made again at once while the grant comes back too late
// to hand out (see lease.Late), as long as ctx allows: each such round takes
// most of a TTL, so this is no busy loop.
func (a *attempt) tryFresh(ctx context.Context) (*Handle, acquireResult, error) {
	for {
		h, res, err := a.try(ctx)
		if !lease.IsLate(err) || ctx.Err() != nil {
			return h, res, err
		}
	}
}

// try makes one request. It returns the new Handle, or what the script said
// about the holder and the queue. A grant that came back with less than
// lease.MinLeft of its lease left is given back, and try returns a
// *lease.LateGrant.
func (a *attempt) try(ctx context.Context) (*Handle, acquireResult, error) {
	l := a.l
	start := time.Now() // the lease starts no earlier than the request leaves
	var res acquireResult
	abandoned := func() {
		// The request was abandoned (ctx ended) but may have reached the
		// server: remove the lock it may have taken, so that a cancelled
		// Acquire leaves nothing behind.
		l.cleanup(a.k, a.owner)
	}
	if a.mode == modeWait {
		// ... and the queue entry it may have made.
		abandoned = func() { l.leave(a.k, a.owner) }
	}
	err := l.execEntered(ctx, func(ctx context.Context) error {
		var err error
		res, err = a.run(ctx)
		return err
	}, abandoned)
	if errors.Is(err, ErrNotReplicated) {
		// Taken on the master, but not confirmed by enough replicas
		// (WithReplicaAck): give it back, guarded by the owner token and
		// announced to the next waiter.
		l.giveBack(ctx, a)
	}
	if err != nil {
		return nil, acquireResult{}, err // res may still be written to
	}
	if !res.ok {
		return nil, res, nil
	}
	if late := lease.Late("redis", "the server", start, a.ttl, a.drift); late != nil {
		// The grant came back too late to be of use (a slow server or
		// link, a request held up in a partition): a Handle of it would be
		// lost at once, or already is. Give it back, guarded by the owner
		// and announced to the next waiter; the caller tries again.
		l.giveBack(ctx, a)
		return nil, acquireResult{}, late
	}
	token, err := l.cfg.Token(res.token)
	if err != nil {
		// A counter beyond any value it reaches by INCR (written by hand):
		// refuse rather than hand out a wrapped-around token.
		l.cleanup(a.k, a.owner)
		return nil, acquireResult{}, err
	}
	h := newHandle(l, a.key, a.k, a.owner, a.oarg, token, a.ttl, a.drift, start)
	if !l.register(h) {
		// Close ran while we were acquiring: give the lock back.
		l.cleanup(a.k, a.owner)
		return nil, acquireResult{}, locker.ErrClosed
	}
	h.start()
	return h, res, nil
}

// giveBack releases the lock a's request took and the caller will not
// hand out, guarded by the owner token; in the background if ctx ends
// first or the request fails.
func (l *Locker) giveBack(ctx context.Context, a *attempt) {
	if err := l.exec(ctx, func(ctx context.Context) error {
		_, err := l.runRelease(ctx, &a.k, a.oarg)
		return err
	}, func() { l.cleanup(a.k, a.owner) }); err != nil {
		l.cleanup(a.k, a.owner)
	}
}

// register holds h for Close (false once Close has begun); unregister
// forgets it, released or lost.
func (l *Locker) register(h *Handle) bool { return l.life.Hold(h) }

func (l *Locker) unregister(h *Handle) { l.life.Drop(h) }

// cleanupTimeout bounds the best-effort deletes of locks nobody holds any
// more (abandoned acquires, lost leases); the lease ends them anyway.
const cleanupTimeout = 5 * time.Second

// cleanup deletes k's lock if it still carries owner, in the background.
// It outlives the start of Close (which waits for it, boundedly): an
// abandoned acquire that went through must not leave a lock behind for its
// whole TTL.
func (l *Locker) cleanup(k keys, owner string) {
	l.background(func(ctx context.Context) { _, _ = l.runRelease(ctx, &k, owner) })
}

// background runs f on a goroutine of the Locker's (Life.Go) with a
// context of cleanupTimeout. Once Close has stopped waiting it runs f on
// the calling goroutine instead: that is a request Close gave up on (see
// Close), which may outlive Close as documented, and what it may have taken
// on the server must still be deleted.
func (l *Locker) background(f func(ctx context.Context)) {
	run := func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		f(ctx)
	}
	if !l.life.Go(run) {
		run()
	}
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
// Close is bounded: it waits at most locker.ReleaseTimeout for the release
// of the held locks, then at most 250ms for calls and goroutines in flight.
// What may outlive it: a request stuck on a dead connection of a
// caller-owned client (New), until its socket deadline (see New); it has no
// effect then, as whatever it may have taken on the server is deleted when
// it ends. When the Locker owns the client (Open), Close closes it, which
// ends those requests, and waits for them: nothing of the Locker outlives
// Close. A second Close returns nil.
func (l *Locker) Close() error {
	// The Pub/Sub connections go first: their goroutines end now rather
	// than at the grace, and a waiter that loses its subscription falls
	// back on its timer until Close ends its wait a moment later.
	l.hub.close()
	return l.life.Close(backend.Closer[*Handle]{
		Release: l.releaseAll,
		Grace:   closeGrace,
		Shutdown: func() error {
			if !l.ownClient {
				return nil
			}
			// Closing the client ends whatever request is still stuck,
			// so that no goroutine of ours outlives Close.
			return l.client.Close()
		},
		Wait: l.ownClient,
	})
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
		pipe := l.via(ctx).Pipeline()
		cmds = make([]*goredis.Cmd, len(held))
		for i, h := range held {
			// EVAL, not EVALSHA: a pipeline cannot fall back on NOSCRIPT.
			if h.k.fam != famMutex {
				cmds[i] = famReleaseScript.Eval(ctx, pipe, h.k.famKeys(h.k.released), l.famReleaseArgs(h.k, h.owner)...)
				continue
			}
			cmds[i] = releaseScript.Eval(ctx, pipe, h.k.releaseKeys(), l.releaseArgs(h.owner)...)
		}
		// Each command's error is read below; a timeout is returned, so
		// that exec can send the (idempotent) pipeline again off the
		// caller's goroutine (see inline).
		if _, err := pipe.Exec(ctx); isTimeout(err) {
			return err
		}
		return nil
	}, nil, inlineWatch)
	if err != nil {
		// The pipeline is abandoned: its results are not ours to read.
		var errs []error
		for _, h := range held {
			errs = append(errs, h.c.Closed(false, err))
		}
		return errors.Join(errs...)
	}
	var errs []error
	for i, h := range held {
		n, err := cmds[i].Int64()
		errs = append(errs, h.c.Closed(err == nil && n == 1, err))
	}
	return errors.Join(errs...)
}
