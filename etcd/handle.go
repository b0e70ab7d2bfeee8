package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// Handle is a held lock: the holder's waiter key is the oldest (smallest
// create revision) of its lock directory. It is safe for concurrent use.
type Handle struct {
	l     *Locker
	ls    *lease
	key   string
	name  *waiterName
	ekey  string // the holder's etcd key
	rev   int64  // its create revision: the fencing token, less the base
	token int64  // the Locker's token base plus rev
	state *backend.State
	watch *time.Timer // starts the watch of the key (heldWatch.add); set by hold before h is shared
	wid   int64       // the key's watch on the Locker's stream, 0 if none (under heldWatch.mu)
	wfrom int64       // the revision that watch starts at (under heldWatch.mu)

	mu        sync.Mutex  // serialises Release
	releasing atomic.Bool // our own deletion is on its way: its event is no loss
	keyGone   atomic.Bool // the key is known to be gone from the server
	swept     bool        // Release after a loss has sent its guarded delete (under mu)
}

var (
	_ locker.Handle   = (*Handle)(nil)
	_ locker.AtRisker = (*Handle)(nil)
)

func newHandle(l *Locker, ls *lease, key string, name *waiterName, rev, token int64) *Handle {
	return &Handle{l: l, ls: ls, key: key, name: name, ekey: name.key, rev: rev, token: token, state: backend.NewState()}
}

// Key returns the key as the caller gave it.
func (h *Handle) Key() string { return h.key }

// Token returns the fencing token: the create revision of the holder's etcd
// key, plus the Locker's token base (WithTokenBase). See the package
// documentation for why it increases across holders.
func (h *Handle) Token() int64 { return h.token }

// TTL returns the lease the server granted the lock's etcd lease: the TTL
// asked rounded down to a whole second, or the server's minimum lease if
// that is longer (2s for a 1s TTL with etcd's default election timeout).
func (h *Handle) TTL() time.Duration { return h.ls.granted }

// Done is closed once the lock is released or lost.
func (h *Handle) Done() <-chan struct{} { h.checkLease(); return h.state.Done() }

// Err is nil while the lock is held, then locker.ErrReleased or an error
// wrapping locker.ErrLost.
func (h *Handle) Err() error { h.checkLease(); return h.state.Err() }

// checkLease declares the loss of the lease now if its deadline has passed
// and its loss timer has not fired yet (see lease.Renewal.Check). The keeper
// is set before the lease's grant is announced, so before any Handle on it
// exists.
func (h *Handle) checkLease() {
	if k := h.ls.keeper; k != nil {
		k.Check()
	}
}

// EtcdKey returns the holder's etcd key, for operators and tests.
func (h *Handle) EtcdKey() string { return h.ekey }

// LeaseID returns the lease the holder's key is attached to (shared by the
// Locker's locks of the same TTL).
func (h *Handle) LeaseID() clientv3.LeaseID { return h.ls.id }

func (h *Handle) lostErr(why string) error {
	return backend.KeyError("hold", h.key, fmt.Errorf("%w: %s", locker.ErrLost, why))
}

// lose ends h with ErrLost for why.
func (h *Handle) lose(why string) {
	h.l.forget(h)
	if err := h.lostErr(why); h.state.End(err) {
		backend.Log{L: h.l.cfg.Logger}.Warn("locker: lock lost", backend.LogKey(h.key), backend.Err(err))
	}
}

// AtRisk is locker.AtRisker's: at risk while the keep-alive of the
// lock's lease is failing (a request failed, or has not answered in
// time), until one succeeds; the lock is lost if none does before the
// lease runs out. Locks of the same TTL share a lease, and so its risk.
func (h *Handle) AtRisk() (bool, <-chan struct{}) { return h.ls.risk.AtRisk() }

// forget takes h from the Locker's held set and its lease, and stops the
// watch of its key (or the timer that would start it).
func (l *Locker) forget(h *Handle) {
	h.watch.Stop()
	l.held.remove(h)
	l.life.Drop(h)
	h.ls.remove(h)
}

// Release deletes the holder's key in a transaction guarded by its create
// revision, so it never deletes a key someone else created since (a stale
// Release after a loss touches nothing), and so wakes the next waiter. A
// key already gone (deleted from outside, or the lease expired) makes it
// fail with an error wrapping locker.ErrLost. When the server cannot be
// reached before ctx ends (or before Close of the Locker has ended the
// lock), the lock is given up all the same: the deletion goes on in the
// background, and the key ends with the lease otherwise.
//
// The same transaction writes the lease's release record (see
// releaseRecord), so that a retried deletion that finds the key gone after
// an attempt whose answer was lost can tell whether that attempt deleted
// it: Release returns nil only when an attempt of its own is proved to
// have deleted the key, and the loss otherwise.
//
// After a loss the client's clock declared, the server may still have the
// key (a partition that healed before the server expired the lease): the
// first Release after it still sends the guarded deletion, in the
// background, and returns the loss.
func (h *Handle) Release(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.l
	if err := h.state.Err(); err != nil {
		if errors.Is(err, locker.ErrLost) && !h.swept && !h.keyGone.Load() {
			h.swept = true
			l.deleteDetached(h.name, h.rev, false)
		}
		return backend.KeyError("release", h.key, err)
	}
	if !l.life.Begin() {
		// Close has begun: it ends the lock (released by Close, or lost
		// if it cannot revoke the lease), boundedly.
		select {
		case <-h.state.Done():
			return backend.KeyError("release", h.key, h.state.Err())
		case <-ctx.Done():
			return backend.KeyError("release", h.key, backend.ContextError(ctx))
		}
	}
	defer l.life.End()
	h.releasing.Store(true)
	// The lease's deadline may have passed without the loss reported yet
	// (the process was paused past it, and this ran first on resuming):
	// then a failed deletion must report the loss, not a release.
	expired := h.ls.keeper != nil && h.ls.keeper.Expired(time.Now())
	// The call ends with ctx, once Close has ended the lock (it revoked
	// the lease, deleting the key, or gave up on it), or at the end of
	// Close's grace: a Release with context.Background on a client whose
	// server is unreachable must not outlive the Locker.
	callerCtx := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctxOf(h.state.Done()), func() {
		if l.life.IsClosing() {
			cancel()
		}
	})
	defer stop()
	stopAbandoned := context.AfterFunc(l.life.Abandoned(), cancel)
	defer stopAbandoned()
	mark := releaseMark(h.rev)
	resp, tries, err := h.sendDelete(ctx, mark)
	l.forget(h)
	if err == nil {
		return h.answered(ctx, resp, tries, mark)
	}
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// The key is ours (the guard held) but the lease the release
		// record names is gone on the server: the key was detached
		// from it (a put from outside) and the lease ended. Every lock
		// on the lease is lost; the key is deleted, guarded.
		h.ls.lose("the lease expired or was revoked on the server")
		l.deleteDetached(h.name, h.rev, false)
		h.state.End(h.lostErr("the lease of the lock expired or was revoked on the server"))
		return backend.KeyError("release", h.key, h.state.Err())
	}
	if expired {
		l.deleteDetached(h.name, h.rev, true)
		h.state.End(h.lostErr(fmt.Sprintf("its lease had run out before Release came, and the deletion failed: %v", err)))
		return backend.KeyError("release", h.key, h.state.Err())
	}
	if !h.state.End(locker.ErrReleased) {
		// Close (or a loss) ended the lock while the deletion was on its
		// way: its error says what became of the key.
		return backend.KeyError("release", h.key, h.state.Err())
	}
	l.deleteDetached(h.name, h.rev, true)
	if callerCtx.Err() != nil {
		err = backend.ContextError(callerCtx)
	}
	return backend.KeyError("release", h.key, fmt.Errorf("etcd: the server did not confirm the deletion of the lock key (the lock is given up; the key is deleted when the server answers, or ends with the lease): %w", err))
}

// sendDelete sends Release's guarded deletion of the holder's key, with
// the write of the lease's release record (mark), and returns the answer
// and the number of attempts. Each attempt is bounded (attemptWait) and
// retried while ctx lasts: a member that stops answering costs one
// attempt. The deletion is guarded, so an earlier attempt applied late
// touches nobody else.
func (h *Handle) sendDelete(ctx context.Context, mark string) (resp *clientv3.TxnResponse, tries int, err error) {
	b := quickBackoff()
	for {
		tries++
		actx, acancel := context.WithTimeout(ctx, attemptWait(h.ls.ttl))
		resp, err = h.l.cli.Txn(actx).
			If(clientv3.Compare(clientv3.CreateRevision(h.ekey), "=", h.rev)).
			Then(clientv3.OpDelete(h.ekey), clientv3.OpPut(h.ls.marker, mark, clientv3.WithLease(h.ls.id))).
			Else(clientv3.OpGet(h.ls.marker)).
			Commit()
		acancel()
		if err == nil || ctx.Err() != nil || !retryable(err) || !b.Wait(ctx) {
			return resp, tries, err
		}
	}
}

// answered is Release's verdict once the server answered its deletion
// (resp, after tries attempts): released when an attempt of its own is
// proved to have deleted the key, lost otherwise.
func (h *Handle) answered(ctx context.Context, resp *clientv3.TxnResponse, tries int, mark string) error {
	ours, why := resp.Succeeded && resp.Responses[0].GetResponseDeleteRange().GetDeleted() == 1, ""
	if !resp.Succeeded {
		why = "the lock key was gone: deleted on the server, or its lease expired"
		if tries > 1 {
			// An earlier attempt got no answer: it may be the one that
			// deleted the key, or the key was taken away (deleted from
			// outside, its lease revoked) while the attempts could not
			// reach the server.
			var cerr error
			ours, cerr = h.l.ownDeletion(ctx, h, mark, resp)
			if cerr != nil {
				why = fmt.Sprintf("the lock key was gone after a deletion attempt that got no answer, and whether that attempt deleted it could not be told (%v): it may have been deleted on the server, or its lease expired, before", cerr)
			}
		}
	}
	h.keyGone.Store(true)
	h.name.free()
	if !ours {
		h.state.End(h.lostErr(why))
		return backend.KeyError("release", h.key, h.state.Err())
	}
	if !h.state.End(locker.ErrReleased) {
		// A loss (or Close) ended the lock while the deletion was on its
		// way: Release says what Err says.
		return backend.KeyError("release", h.key, h.state.Err())
	}
	return nil
}

// deleteDetached deletes the key of name if its create revision is still
// rev, in the background, until the server answers, the lease is given up
// or the Locker closes (Close revokes the lease). With retry false (after
// the lease was given up) it makes one attempt, bounded by cleanupWait and
// by Close's grace.
func (l *Locker) deleteDetached(name *waiterName, rev int64, retry bool) {
	if l.life.IsClosing() {
		return // Close revokes the lease
	}
	l.life.Go(func() {
		if !retry {
			ctx, cancel := context.WithTimeout(l.life.Abandoned(), cleanupWait)
			defer cancel()
			_, _ = l.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(name.key), "=", rev)).
				Then(clientv3.OpDelete(name.key)).
				Commit()
			return
		}
		ctx, cancel := context.WithCancel(l.life.Closing())
		defer cancel()
		stop := context.AfterFunc(name.ls.lostCtx, cancel)
		defer stop()
		if l.deleteGuarded(ctx, name.key, rev) == nil {
			name.free()
		}
	})
}

// ctxOf returns a context that ends when done closes. Its goroutine-free
// form (context.AfterFunc on it) lets a watch end with the lock.
func ctxOf(done <-chan struct{}) context.Context { return doneCtx(done) }

type doneCtx <-chan struct{}

func (doneCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c doneCtx) Done() <-chan struct{}     { return c }
func (c doneCtx) Err() error {
	select {
	case <-c:
		return context.Canceled
	default:
		return nil
	}
}
func (doneCtx) Value(any) any { return nil }
