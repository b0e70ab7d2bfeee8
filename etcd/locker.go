package etcd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/backoff"
)

// cleanupWait bounds each attempt to delete the waiter key of an Acquire
// that gave up (its context ended, its wait failed); the attempts go on in
// the background until the server answers, the lease is given up or the
// Locker closes.
const cleanupWait = 2 * time.Second

// cleanupReturn bounds how long the Acquire that gave up waits for that
// deletion before it returns: long enough for a server that answers (so
// that the caller's next attempt finds the directory clean), short enough
// that a call whose context ended returns promptly when it does not.
const cleanupReturn = 300 * time.Millisecond

// closeWait bounds how long Close waits for the server to revoke the
// Locker's leases. It is below locker.ReleaseTimeout: a lease Close could
// not revoke is no longer renewed, so the server expires it (and frees its
// keys) one TTL later all the same.
const closeWait = 3 * time.Second

// closeGrace is how long Close then waits for the calls and goroutines
// still in flight: long enough for a revocation or a deletion that runs
// detached (a lease retired, or granted as Close began; a key deleted after
// a loss) to be answered by a server that answers, short enough that Close
// stays prompt when it does not.
const closeGrace = time.Second

// errWaitLost says a contender's waiter key vanished, or its lease was
// given up, while it waited: it holds nothing and must not say it does.
var errWaitLost = errors.New("etcd: the waiter key was deleted or its lease expired while waiting")

// Locker takes locks in one etcd cluster through a *clientv3.Client the
// caller owns. It is safe for concurrent use. Make one with New.
type Locker struct {
	cli   *clientv3.Client
	cfg   config
	owns  bool      // Open made the client: Close closes it
	diag  *connDiag // Open made a TLS client: why its latest connection failed
	nonce string    // tells this Locker's waiter keys from other Lockers'

	// life admits the calls, tracks the handles held and the goroutines
	// (keep-alives, the watch stream of the held keys, background deletions, detached
	// revocations), and runs Close.
	life *backend.Life[*Handle]

	mu        sync.Mutex
	leases    map[time.Duration]*lease
	leasesEnd bool // Close has taken the leases to revoke them
	guards    int  // names of unknown fate being watched (see resolve)

	held heldWatch // the watches on the holders' keys
}

var _ locker.Locker = (*Locker)(nil)

// New returns a Locker on cli, which the caller keeps: Close revokes the
// Locker's leases but leaves cli open. Options that are invalid make every
// call fail with an error wrapping locker.ErrInvalidOption.
func New(cli *clientv3.Client, opts ...Option) *Locker {
	cfg := newConfig(opts)
	if cli == nil && cfg.err == nil {
		cfg.err = fmt.Errorf("etcd: New: %w: nil client", locker.ErrInvalidOption)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	l := &Locker{
		cli:    cli,
		cfg:    cfg,
		nonce:  hex.EncodeToString(b[:]),
		life:   backend.NewLife[*Handle](cfg.err),
		leases: map[time.Duration]*lease{},
	}
	l.held.l = l
	return l
}

// Client returns the etcd client the Locker uses.
func (l *Locker) Client() *clientv3.Client { return l.cli }

// Prefix returns the key prefix of the lock directories.
func (l *Locker) Prefix() string { return l.cfg.Prefix }

// Acquire waits until key is held, ctx ends, or the Locker is closed.
// Waiters are served in the order they arrived (the create revisions of
// their waiter keys); each watches only the key just before its own.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "acquire", key, mutexKind, true, opts))
}

// TryAcquire takes key if nobody holds it or waits for it, and fails with an
// error wrapping locker.ErrNotAcquired otherwise, without waiting and
// without writing anything to the server in that case.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "try-acquire", key, mutexKind, false, opts))
}

// acquire takes the lock of kind k (the mutex, a read or write lock, a
// permit of a semaphore) of key.
func (l *Locker) acquire(ctx context.Context, op, key string, k lockKind, wait bool, opts []locker.Option) (*Handle, error) {
	// The context of the call ends when the caller's does or when Close
	// begins; Why tells which.
	cctx, done, err := l.life.Enter(ctx, op, key)
	if err != nil {
		return nil, err
	}
	defer done()
	o, err := backend.ApplyOptions(opts...)
	if err != nil {
		return nil, backend.KeyError(op, key, err)
	}
	ttl := l.cfg.TTL
	if o.TTL != 0 {
		if err := checkTTL(o.TTL); err != nil {
			return nil, backend.KeyError(op, key, err)
		}
		ttl = o.TTL
	}
	// TryAcquire makes one attempt: its retries (of the grant, of a
	// create that got no answer) end after tryWait, whatever the
	// caller's deadline, so that a cluster that does not answer makes it
	// fail rather than hang.
	actx := cctx
	if !wait {
		var tcancel context.CancelFunc
		actx, tcancel = context.WithTimeout(cctx, tryWait(ttl))
		defer tcancel()
	}
	fail := func(err error) error {
		switch {
		case cctx.Err() != nil:
			err = l.life.Why(cctx, err)
		case actx.Err() != nil:
			err = fmt.Errorf("etcd: the cluster did not answer within %v (TryAcquire makes one attempt): %v", tryWait(ttl), err)
		}
		if cerr := l.diag.err(); cerr != nil && actx.Err() != nil {
			err = fmt.Errorf("%w (the latest connection failed: %v)", err, cerr)
		}
		return backend.KeyError(op, key, err)
	}

	t := turnOf(l.cfg.Prefix, key, k)
	if k.family == mutexFamily {
		t.desc = o.Owner
	}
	gone := 0
	unknown := retryBackoff()
	for {
		h, err := l.attempt(actx, key, t, ttl, wait)
		if err == nil {
			return h, nil
		}
		if actx.Err() == nil {
			switch {
			case errors.Is(err, errLeaseGone) && gone < 3:
				gone++
				continue // the lease was revoked under us: a fresh one
			case errors.Is(err, errUnknownOutcome):
				// No answer in time (a member that hangs, a broken
				// connection): the name is guarded; try again with
				// another while ctx lasts.
				if unknown.Wait(actx) {
					continue
				}
			}
		}
		return nil, fail(err)
	}
}

// tryWait bounds a TryAcquire whose calls the cluster does not answer: three
// attempt windows (see attemptWait), about one TTL, at least 3s and at most
// 15s, so that a member that hangs still leaves time for another to answer.
func tryWait(ttl time.Duration) time.Duration { return 3 * attemptWait(ttl) }

// errLeaseGone says the server no longer knows the lease a put named.
var errLeaseGone = errors.New("etcd: the lease was revoked or expired on the server")

// attempt makes one contender of turn t for key on the Locker's lease for
// ttl.
func (l *Locker) attempt(ctx context.Context, key string, t turn, ttl time.Duration, wait bool) (*Handle, error) {
	ls, err := l.leaseFor(ctx, ttl)
	if err != nil {
		return nil, err
	}
	name := l.newName(ls, t.sub)
	me := name.key
	put := clientv3.OpPut(me, t.desc, clientv3.WithLease(ls.id))
	// Each create is bounded by attemptWait: a member that stops
	// answering must not hold the Acquire for as long as ctx lasts.
	tctx, tcancel := context.WithTimeout(ctx, attemptWait(ls.ttl))
	defer tcancel()
	txnErr := func(err error) error {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			ls.lose(errLeaseGone.Error())
			return errLeaseGone
		}
		// The put may have been applied, or may still be (a request
		// held by a slow member): its outcome is unknown.
		l.cleanup(name, 0)
		if ctx.Err() == nil && retryable(err) {
			return fmt.Errorf("%w: %w", errUnknownOutcome, err)
		}
		return fmt.Errorf("etcd: %w", err)
	}

	if err := ctx.Err(); err != nil {
		// Ended while the lease was granted: nothing sent, nothing to
		// guard.
		name.free()
		return nil, err
	}
	var (
		rev  int64
		mark bool // a semaphore's holder admitted after waiting: see markTurn
	)
	switch {
	case !wait && t.limit > 0:
		// A semaphore: create our key only if fewer than n keys are in
		// the directory (see trySemaphore); nothing is written otherwise.
		rev, err = l.trySemaphore(ctx, ls, t, me, put)
		var (
			left *leftoverKey
			ns   *notSent
		)
		switch {
		case errors.As(err, &ns):
			name.free()
			return nil, ns.err
		case errors.As(err, &left):
			l.cleanup(name, left.rev)
			return nil, err
		case errors.Is(err, locker.ErrNotAcquired), errors.Is(err, locker.ErrLimitMismatch):
			name.free()
			return nil, err
		case err != nil:
			return nil, txnErr(err)
		}
	case !wait:
		// Create our key only if no key is in the block range (a compare
		// over the whole range: every key in it must have create
		// revision 0, which holds only when there is none): the whole
		// directory for the mutex and a writer, the writers' keys for a
		// reader. When it fails, nothing is written, so nothing needs
		// deleting.
		resp, err := l.cli.Txn(tctx).
			If(clientv3.Compare(clientv3.CreateRevision(t.block), "=", 0).WithPrefix()).
			Then(put).
			Commit()
		if err != nil {
			return nil, txnErr(err)
		}
		if !resp.Succeeded {
			name.free()
			return nil, locker.ErrNotAcquired
		}
		rev = resp.Header.Revision
	default:
		// One round trip: create our waiter key and read what decides
		// our turn (firstRead: the oldest key of the block range, or a
		// semaphore's count). A semaphore's create also requires that no
		// key of another n is in the directory. The name is known to be
		// free (a name whose put may still land stays reserved: see
		// resolve); should a key of it exist all the same, it is on our
		// lease and named for this Locker, so we take it over (its
		// create revision then orders us) rather than leave it to block
		// every later contender.
		first := t.firstRead()
		resp, err := l.cli.Txn(tctx).
			If(append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(me), "=", 0)}, t.sameLimit()...)...).
			Then(put, first).
			Else(append([]clientv3.Op{clientv3.OpGet(me), first}, t.otherLimitReads()...)...).
			Commit()
		if err != nil {
			return nil, txnErr(err)
		}
		rev = resp.Header.Revision
		admitted := resp.Succeeded && t.admittedAtOnce(resp, 1, rev)
		if !resp.Succeeded {
			own := resp.Responses[0].GetResponseRange().GetKvs()
			if err := t.limitMismatch(resp.Responses[2:]); err != nil {
				if len(own) > 0 {
					l.cleanup(name, own[0].CreateRevision)
				} else {
					name.free()
				}
				return nil, err
			}
			if len(own) == 0 {
				l.cleanup(name, 0)
				return nil, fmt.Errorf("etcd: the server reported the waiter key %q both absent and present", me)
			}
			rev = own[0].CreateRevision
			// A semaphore's turn is read by waitTurn; the others' from
			// the oldest key of the block range.
			admitted = t.limit == 0 && t.blockClear(resp.Responses[1].GetResponseRange().GetKvs(), rev)
		}
		if !admitted {
			if err := l.waitTurn(ctx, ls, t, me, rev); err != nil {
				l.cleanup(name, rev)
				return nil, err
			}
			mark = t.limit > 0
		}
	}
	h, err := l.hold(ls, key, name, rev)
	if err != nil {
		l.cleanup(name, rev)
		return nil, err
	}
	if mark {
		l.markTurn(h)
	}
	return h, nil
}

// waitTurn waits until the contender of turn t whose waiter key is me
// (create revision rev) may hold, watching one key (or, for a semaphore's
// first waiter, one range) at a time:
//
//   - the mutex, a writer: until no older key is in the directory,
//     watching the newest older one (its predecessor) for its deletion;
//   - a reader: until no older writer's key is, watching the newest older
//     writer's key for its deletion;
//   - a permit of a semaphore of n: until fewer than n older keys are.
//     With exactly n (the first waiter), it watches the directory for
//     deletions: the release of any holder frees a permit for it, and
//     admits it without another read (see below). With
//     more (a later waiter), it watches its predecessor, itself a waiter,
//     for any change: its deletion (it gave up), or its re-put once it
//     holds (markTurn), either of which may make this one the first
//     waiter. So one release wakes one waiter.
//
// It fails when me is gone or the lease is lost: a contender never goes on
// to hold a key it no longer has.
func (l *Locker) waitTurn(ctx context.Context, ls *lease, t turn, me string, rev int64) error {
	// Every read and watch of the wait ends when the lease is lost, not
	// only when ctx does: a read that hangs (a partition) must not keep a
	// contender whose lease is gone waiting.
	callerCtx := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ls.lostCtx, cancel)
	defer stop()
	for {
		select {
		case <-ls.lost:
			return fmt.Errorf("%w: %s", errWaitLost, ls.lostReason())
		default:
		}
		// Each read is bounded (attemptWait): a member that stops
		// answering costs one attempt, the next goes to another.
		rctx, rcancel := context.WithTimeout(ctx, attemptWait(ls.ttl))
		resp, err := l.cli.Txn(rctx).Then(clientv3.OpGet(me), t.waitRead(rev)).Commit()
		rcancel()
		if err != nil {
			if callerCtx.Err() != nil {
				return callerCtx.Err()
			}
			if ctx.Err() != nil {
				return fmt.Errorf("%w: %s", errWaitLost, ls.lostReason())
			}
			// The server did not answer (a member down, no leader): the
			// lease deadline decides how long that may last.
			if !backoff.Sleep(ctx, 100*time.Millisecond, ls.lost) {
				return waitEnded(ctx, ls)
			}
			continue
		}
		own := resp.Responses[0].GetResponseRange().GetKvs()
		if len(own) == 0 || own[0].CreateRevision != rev {
			return errWaitLost
		}
		preds := resp.Responses[1].GetResponseRange().GetKvs()
		if len(preds) < max(t.limit, 1) {
			return nil
		}
		// Watch from just after the revision of the read: no change in
		// between is missed. A watch that fails (compacted, cancelled,
		// the member lost its leader) reads again instead.
		from := clientv3.WithRev(resp.Header.Revision + 1)
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		var (
			wch  clientv3.WatchChan
			wake = isDelete
		)
		switch {
		case t.limit == 0:
			wch = l.cli.Watch(wctx, string(preds[0].Key), from, clientv3.WithFilterPut())
		case len(preds) == t.limit:
			// The first waiter: exactly n older keys at the read, and no
			// key can become older than ours, so the deletion of any of
			// them admits us. The watch covers our own key too, and its
			// events come in revision order: a deletion of ours before
			// that one is seen first. So the event decides, without
			// another read.
			wch = l.cli.Watch(wctx, t.dir, from, clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithPrevKV())
			wake = func(ev *clientv3.Event) wakeUp {
				switch {
				case string(ev.Kv.Key) == me:
					return wokenLost
				case ev.PrevKv == nil: // its history compacted: read again
					return wokenRead
				case ev.PrevKv.CreateRevision < rev:
					return wokenAdmitted
				}
				return notWoken // a later waiter gave up
			}
		default:
			// A later waiter: any change of its predecessor (preds is
			// newest first).
			wch = l.cli.Watch(wctx, string(preds[0].Key), from)
			wake = func(*clientv3.Event) wakeUp { return wokenRead }
		}
		w, err := l.awaitEvent(ctx, ls, wch, wake)
		wcancel()
		switch {
		case err != nil:
			return err
		case w == wokenAdmitted:
			return nil
		case w == wokenLost:
			return errWaitLost
		}
	}
}

// wakeUp is what a watch event means to a waiter.
type wakeUp uint8

const (
	notWoken      wakeUp = iota // nothing for it: watch on
	wokenRead                   // its turn may have come: read again
	wokenAdmitted               // its turn has come
	wokenLost                   // its own key is gone
)

// isDelete wakes a waiter to read again on a deletion.
func isDelete(ev *clientv3.Event) wakeUp {
	if ev.Type == clientv3.EventTypeDelete {
		return wokenRead
	}
	return notWoken
}

// awaitEvent returns what the first event of wch that wakes the waiter
// means (wake), wokenRead if the watch fails, or an error when ctx ends or
// the lease is lost.
func (l *Locker) awaitEvent(ctx context.Context, ls *lease, wch clientv3.WatchChan, wake func(*clientv3.Event) wakeUp) (wakeUp, error) {
	for {
		select {
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil || wr.Canceled {
				return wokenRead, nil
			}
			for _, ev := range wr.Events {
				if w := wake(ev); w != notWoken {
					return w, nil
				}
			}
		case <-ls.lost:
			return 0, fmt.Errorf("%w: %s", errWaitLost, ls.lostReason())
		case <-ctx.Done():
			return 0, waitEnded(ctx, ls)
		}
	}
}

// waitEnded is the error of a wait whose ctx ended: the lease's loss if
// that is what ended it (waitTurn's ctx ends with the lease).
func waitEnded(ctx context.Context, ls *lease) error {
	select {
	case <-ls.lost:
		return fmt.Errorf("%w: %s", errWaitLost, ls.lostReason())
	default:
		return ctx.Err()
	}
}

// hold makes the Handle of the waiter key me, which is now the oldest of
// its directory, and starts watching it.
func (l *Locker) hold(ls *lease, key string, name *waiterName, rev int64) (*Handle, error) {
	token, err := l.cfg.Token(rev)
	if err != nil { // a revision beyond 2^62: cannot happen (see doc.go)
		return nil, err
	}
	h := newHandle(l, ls, key, name, rev, token)
	// The watch on the holder's own key starts watchDelay later, from a
	// runtime timer: a lock released before then costs no goroutine and
	// no watch. The timer is set before h is shared (a loss stops it).
	h.watch = time.AfterFunc(watchDelay, func() { l.held.add(h) })
	fail := func(err error) (*Handle, error) {
		h.watch.Stop()
		h.state.End(err)
		return nil, err
	}
	// The lease's deadline may have passed without its loss reported yet:
	// the process was paused past it, or the loss timer has not run yet on
	// a busy machine, and the answer that made us the holder came first.
	// The server may have expired the lease (and given the key to the
	// next waiter) since that answer: declare the loss now (Check), so
	// that add below refuses the lease.
	if ls.keeper != nil {
		ls.keeper.Check()
	}
	// On the lease first, then held: a Close that finds h held finds it
	// on its lease too.
	if !ls.add(h) {
		return fail(fmt.Errorf("%w: %s", errWaitLost, ls.lostReason()))
	}
	if !l.life.Hold(h) {
		ls.remove(h)
		return fail(locker.ErrClosed)
	}
	return h, nil
}

// cleanup deletes the waiter key of an Acquire that gave up, waiting at
// most cleanupReturn, with contexts of its own (the caller's may have
// ended). rev is the key's create revision, or 0 when the put's outcome is
// unknown (its transaction got no answer): resolve then finds the key or
// guards its name against a put applied later. The deletion is guarded by
// the create revision, and the name stays reserved (no other contender of
// the Locker uses it) until the key is known to be gone. If the server
// does not answer in time, this goes on in the background until it does,
// the lease is given up (the key then ends with the lease) or the Locker
// closes (Close revokes the lease).
func (l *Locker) cleanup(name *waiterName, rev int64) {
	if l.life.IsClosing() {
		return // Close revokes the lease, and the key with it
	}
	done := make(chan struct{})
	var once sync.Once
	first := func() { once.Do(func() { close(done) }) }
	if !l.life.Go(func() {
		ctx, cancel := context.WithCancel(l.life.Closing()) // Close revokes the lease
		defer cancel()
		stop := context.AfterFunc(name.ls.lostCtx, cancel) // the key ends with the lease
		defer stop()
		if rev == 0 {
			l.resolve(ctx, name, first)
			return
		}
		defer first()
		if l.deleteGuarded(ctx, name.key, rev) == nil {
			name.free()
		}
	}) {
		return
	}
	t := time.NewTimer(cleanupReturn)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-l.life.Closing().Done():
	}
}

// Close releases every lock the Locker holds (their handles end with
// locker.ErrReleasedByClose) by revoking its leases, which deletes every
// key on them at once; ends its waiting Acquires with errors wrapping
// locker.ErrClosed; and stops its goroutines. It leaves the client open
// (unless Open made it). A Release in flight ends with it.
//
// Close is bounded: it waits at most locker.ReleaseTimeout (here closeWait,
// 3s) for the release of the held locks, then at most 1s for calls and
// goroutines in flight. A lease it could not revoke (the server
// unreachable) is no longer renewed, so the server frees its keys one TTL
// later; Close then says so, and those handles end with an error wrapping
// locker.ErrLost and locker.ErrClosed. What may outlive Close, on a client
// the caller owns, is a goroutine of the Locker whose etcd request was
// cancelled at the end of that wait, while it returns; on a client Open
// made, which Close closes, nothing does. A second Close, concurrent with
// the first, returns nil once the first has returned.
func (l *Locker) Close() error {
	return l.life.Close(backend.Closer[*Handle]{
		Release: l.revokeAll,
		Grace:   closeGrace,
		Shutdown: func() error {
			// No lock was held: the leases (which may still carry
			// waiter keys) are revoked now.
			_ = l.revokeAll(nil)
			if !l.owns {
				return nil
			}
			if err := l.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
				return fmt.Errorf("etcd: closing the client: %w", err)
			}
			return nil
		},
		Wait: l.owns,
	})
}

// revokeAll revokes the Locker's leases, once (later calls do nothing),
// which deletes every key on them at once, and ends the handles held when
// Close began: with locker.ErrReleasedByClose, or, for a lease it could not
// revoke within closeWait, with an error wrapping locker.ErrLost and
// locker.ErrClosed, which it returns.
func (l *Locker) revokeAll(held []*Handle) error {
	l.mu.Lock()
	if l.leasesEnd {
		l.mu.Unlock()
		return nil
	}
	l.leasesEnd = true
	leases := make([]*lease, 0, len(l.leases))
	for _, ls := range l.leases {
		leases = append(leases, ls)
		if ls.idle != nil {
			ls.idle.Stop()
		}
	}
	l.mu.Unlock()

	isHeld := make(map[*Handle]bool, len(held))
	for _, h := range held {
		isHeld[h] = true
		h.releasing.Store(true) // the revocation deletes their keys: no loss
		h.watch.Stop()
	}
	var (
		wg   sync.WaitGroup // the revocations, one per lease, in parallel
		mu   sync.Mutex
		errs []error
	)
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	for _, ls := range leases {
		// Close has ended the calls' contexts: a grant in flight answers
		// (or gives up) promptly.
		<-ls.ready
		if ls.err != nil {
			continue
		}
		ls.keeper.Stop()
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := l.cli.Revoke(ctx, ls.id)
			ls.lostMu.Lock()
			hs := ls.handles
			ls.handles = map[*Handle]struct{}{}
			ls.lostMu.Unlock()
			for h := range hs {
				if !isHeld[h] {
					continue
				}
				if err == nil {
					h.state.End(locker.ErrReleasedByClose)
					continue
				}
				lost := backend.KeyError("close", h.key, fmt.Errorf("%w: %w: could not revoke the lease (the server frees the key when the lease expires): %v", locker.ErrLost, locker.ErrClosed, err))
				if h.state.End(lost) {
					mu.Lock()
					errs = append(errs, lost)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	// Handles whose lease was given up before Close ended already.
	for _, h := range held {
		h.state.End(locker.ErrReleasedByClose)
	}
	return errors.Join(errs...)
}
