package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/backoff"
	leases "github.com/go-locker/locker/internal/lease"
)

// lease is one etcd lease, shared by every lock of a Locker taken with the
// same TTL (as concurrency.Session shares one): acquiring costs one write
// (the waiter key), releasing one (its deletion), and renewals are per
// lease, not per lock.
type lease struct {
	l     *Locker
	ttl   time.Duration // asked for (rounded up to a second)
	ready chan struct{} // closed once the grant has answered
	err   error         // of the grant; set before ready closes

	id      clientv3.LeaseID
	granted time.Duration   // the TTL the server granted
	marker  string          // the lease's release record (see releaseRecord)
	keeper  *leases.Renewal // renews it and times its loss; set before ready closes
	risk    backend.Risk    // its keep-alive failed and none has succeeded since

	lostCtx    context.Context    // ends once the lease is given up
	lostCancel context.CancelFunc // ends lostCtx
	lost       <-chan struct{}    // lostCtx.Done()
	lostMu     sync.Mutex
	lostErr    string
	ended      bool
	handles    map[*Handle]struct{}
	slots      slots // the waiter key names in use on this lease

	// Under l.mu: the uses of the lease (a leaseFor call, then the waiter
	// name it was for, until the key is known gone or absent; see
	// waiterName.drop), and the timer that retires the lease once it has
	// had none for idleLinger (see unuse).
	users     int
	idleSince time.Time
	idle      *time.Timer
}

// idleLinger is how long a lease for a TTL other than the Locker's default
// is kept once nothing uses it: one TTL, at most 30s. A Locker given many
// different TTLs (locker.WithTTL computed per call) would otherwise keep,
// and renew, a lease for each of them until Close. The default TTL's lease
// is kept, as a concurrency.Session keeps its one lease: an Acquire after a
// quiet spell then costs no grant.
func idleLinger(ttl time.Duration) time.Duration { return min(ttl, 30*time.Second) }

// leaseFor returns the Locker's live lease for ttl, granting one when there
// is none. The caller owes the lease one unuse: the waiter name it takes
// on it (newName) pays it when freed or left to a guard (waiterName.drop).
func (l *Locker) leaseFor(ctx context.Context, ttl time.Duration) (*lease, error) {
	ttl = time.Duration(leaseSeconds(ttl)) * time.Second
	for {
		l.mu.Lock()
		if l.life.IsClosing() {
			l.mu.Unlock()
			return nil, locker.ErrClosed
		}
		ls := l.leases[ttl]
		mine := ls == nil
		if mine {
			ls = &lease{l: l, ttl: ttl, ready: make(chan struct{}), handles: map[*Handle]struct{}{}}
			ls.lostCtx, ls.lostCancel = context.WithCancel(context.Background())
			ls.lost = ls.lostCtx.Done()
			l.leases[ttl] = ls
		}
		// Taken now, so that the lease cannot be retired between its
		// grant and our use of it; given back below unless returned.
		ls.users++
		l.mu.Unlock()
		if mine {
			ls.grant(ctx)
		}
		select {
		case <-ls.ready:
		case <-ctx.Done():
			ls.unuse()
			return nil, ctx.Err()
		}
		if ls.err == nil {
			l.mu.Lock()
			live := l.leases[ttl] == ls // not given up or retired since
			l.mu.Unlock()
			if live {
				return ls, nil
			}
			ls.unuse()
			continue // a fresh one
		}
		ls.unuse()
		if mine || ctx.Err() != nil {
			return nil, ls.err
		}
		// Another caller's grant failed (perhaps its context ended): try
		// again with ours.
	}
}

// grant asks the server for the lease and starts renewing it.
func (ls *lease) grant(ctx context.Context) {
	l := ls.l
	var (
		sent time.Time
		resp *clientv3.LeaseGrantResponse
		err  error
	)
	// Each attempt is bounded (attemptWait), retried while ctx lasts: a
	// member that stops answering must not hold this Acquire, and the
	// concurrent ones waiting for the grant, for as long as ctx lasts.
	// A grant that timed out may have been made all the same; that lease
	// has no key and expires unrenewed.
	b := quickBackoff()
	for {
		sent = time.Now()
		actx, cancel := context.WithTimeout(ctx, attemptWait(ls.ttl))
		resp, err = l.cli.Grant(actx, leaseSeconds(ls.ttl))
		cancel()
		if err == nil || ctx.Err() != nil || !retryable(err) || !b.Wait(ctx) {
			break
		}
	}
	if err == nil && resp.TTL <= 0 {
		err = fmt.Errorf("etcd: the server granted a lease of TTL %ds", resp.TTL)
	}
	if err != nil {
		ls.err = fmt.Errorf("etcd: granting a lease: %w", err)
		l.mu.Lock()
		if l.leases[ls.ttl] == ls {
			delete(l.leases, ls.ttl)
		}
		l.mu.Unlock()
		close(ls.ready)
		return
	}
	ls.id = clientv3.LeaseID(resp.ID)
	ls.marker = releaseRecord(l.cfg.Prefix, ls.id)
	ls.granted = time.Duration(resp.TTL) * time.Second
	interval := min(ls.ttl, ls.granted) / 3
	if time.Since(sent) > interval {
		// The grant was answered late (an election, a slow member): the
		// deadline counted from its sending would leave little or no
		// time. A renewal answered now starts the lease's time afresh.
		rsent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, interval)
		if r, err := l.cli.KeepAliveOnce(rctx, ls.id); err == nil && r.TTL > 0 {
			sent = rsent
		}
		cancel()
	}
	if l.life.IsClosing() {
		// Close has run or is running: give the lease back ourselves.
		ls.err = locker.ErrClosed
		close(ls.ready)
		l.revokeDetached(ls.id)
		return
	}
	ls.keeper = leases.StartRenewal(sent, leases.RenewConfig{
		TTL:      ls.granted,
		Drift:    l.cfg.driftMargin(ls.granted),
		Interval: interval,
		Retry:    min(interval, 200*time.Millisecond),
		Renew:    ls.renew,
		Lost:     ls.expired,
		Failed:   ls.renewFailed,
		Renewed:  ls.renewed,
		Go:       l.life.Run,
	})
	close(ls.ready)
}

// unuse gives back one use taken by leaseFor.
func (ls *lease) unuse() {
	l := ls.l
	l.mu.Lock()
	defer l.mu.Unlock()
	ls.users--
	if ls.users == 0 {
		ls.idleLocked()
	}
}

// idleLocked starts the lease's idle time (l.mu held): it is retired
// after idleLinger unless used again. The Locker's default lease is kept.
func (ls *lease) idleLocked() {
	l := ls.l
	if ls.ttl == time.Duration(leaseSeconds(l.cfg.TTL))*time.Second || l.life.IsClosing() || l.leases[ls.ttl] != ls {
		return // the default lease; Close revokes it; lost already
	}
	ls.idleSince = time.Now()
	if ls.idle == nil {
		ls.idle = time.AfterFunc(idleLinger(ls.ttl), func() { l.life.Run(ls.retire) })
	} else {
		ls.idle.Reset(idleLinger(ls.ttl))
	}
}

// retire revokes the lease if it has stayed unused for idleLinger. It has
// no keys then: every waiter name on it is known gone from the server, or
// was absent at a read and is watched by a guard (see resolve); a late put
// of that name fails once the lease is revoked.
func (ls *lease) retire() {
	l := ls.l
	l.mu.Lock()
	if l.life.IsClosing() || l.leases[ls.ttl] != ls || ls.users != 0 {
		l.mu.Unlock() // Close revokes it; a lost one is gone; in use again
		return
	}
	if left := idleLinger(ls.ttl) - time.Since(ls.idleSince); left > 0 {
		ls.idle.Reset(left) // used and given back since this timer was set
		l.mu.Unlock()
		return
	}
	delete(l.leases, ls.ttl)
	l.mu.Unlock()
	ls.lose("the lease was retired after going unused")
	l.revokeDetached(ls.id)
}

// renew sends one keep-alive. Each attempt is bounded by the renewal
// interval (and by the lease's deadline, through ctx), so that a member
// that hangs costs one attempt: the client sends the next to another
// member.
func (ls *lease) renew(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, min(ls.ttl, ls.granted)/3)
	defer cancel()
	r, err := ls.l.cli.KeepAliveOnce(ctx, ls.id)
	switch {
	case err == nil && r.TTL > 0:
		return true, nil
	case err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound):
		return false, nil // expired or revoked on the server
	}
	return false, err
}

// renewFailed is the keeper's report of a keep-alive that failed (or has
// not answered in time): every lock on the lease is at risk.
func (ls *lease) renewFailed(err error) {
	log := backend.Log{L: ls.l.cfg.Logger}
	if ls.risk.Set(true) {
		log.Warn("locker: etcd lease at risk: keep-alive failed, retrying", slog.Int64("lease", int64(ls.id)), backend.Err(err), slog.Duration("ttl", ls.granted))
		return
	}
	log.Debug("locker: etcd keep-alive failed again, retrying", slog.Int64("lease", int64(ls.id)), backend.Err(err))
}

// renewed is the keeper's report of a keep-alive that succeeded.
func (ls *lease) renewed() {
	if ls.risk.Set(false) {
		backend.Log{L: ls.l.cfg.Logger}.Info("locker: etcd lease no longer at risk: keep-alive succeeded", slog.Int64("lease", int64(ls.id)))
	}
}

// expired is the keeper's report that the lease is lost (the keeper has
// stopped itself). It may run before grant has stored the keeper.
func (ls *lease) expired(cause error) {
	if errors.Is(cause, leases.ErrGone) {
		ls.end("the lease expired or was revoked on the server")
		return
	}
	ls.end("the lease was not renewed in time (" + cause.Error() + ")")
	// The server may still keep the lease (renewals that arrived but
	// whose answers did not, a partition that heals): revoke it, so that
	// its keys do not block others until it expires there.
	ls.l.revokeLost(ls)
}

// revokeLost revokes a lease given up by the client's clock, in the
// background: attempts bounded by attemptWait, for at most the granted
// TTL (the server expires it by then anyway); a Close that begins during
// its pause ends it, one that begins later gives it its grace.
func (l *Locker) revokeLost(ls *lease) {
	if l.life.IsClosing() {
		return
	}
	l.life.Go(func() {
		ctx, cancel := context.WithTimeout(l.life.Abandoned(), ls.granted)
		defer cancel()
		// Not at once: the holders were told just now, and without the
		// revoke the server would keep the keys at least the drift margin
		// longer (the client gives the lease up that much before the
		// server could expire it). Revoking at once gave the key to the
		// next waiter within milliseconds of the holder's Done closing,
		// before a busy holder process could even see it (the chaos suite
		// caught a second holder 120ms before the first saw its loss).
		// Keep that margin for the holders; free the key sooner than the
		// server's expiry all the same. A Close that begins meanwhile ends
		// this: the server expires the lease.
		if !backoff.Sleep(ctx, l.cfg.driftMargin(ls.granted), l.life.Closing().Done()) {
			return
		}
		b := retryBackoff()
		for {
			actx, acancel := context.WithTimeout(ctx, attemptWait(ls.ttl))
			_, err := l.cli.Revoke(actx, ls.id)
			acancel()
			if err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound) || !b.Wait(ctx) {
				return
			}
		}
	})
}

// lose gives the lease up: every lock on it is lost, waits on it fail, and
// the Locker grants a new lease for later locks. The keys on it go when
// the server expires it (it is no longer renewed).
func (ls *lease) lose(why string) {
	ls.keeper.Stop()
	ls.end(why)
}

// end is lose without stopping the keeper.
func (ls *lease) end(why string) {
	l := ls.l
	l.mu.Lock()
	if l.leases[ls.ttl] == ls {
		delete(l.leases, ls.ttl)
	}
	l.mu.Unlock()
	ls.lostMu.Lock()
	if ls.ended {
		ls.lostMu.Unlock()
		return
	}
	ls.ended, ls.lostErr = true, why
	hs := ls.handles
	ls.handles = nil
	ls.lostCancel()
	ls.lostMu.Unlock()
	for h := range hs {
		h.lose(why)
	}
}

// add registers h on the lease, unless the lease is already lost.
func (ls *lease) add(h *Handle) bool {
	ls.lostMu.Lock()
	defer ls.lostMu.Unlock()
	if ls.ended {
		return false
	}
	ls.handles[h] = struct{}{}
	return true
}

func (ls *lease) remove(h *Handle) {
	ls.lostMu.Lock()
	delete(ls.handles, h)
	ls.lostMu.Unlock()
}

func (ls *lease) lostReason() string {
	ls.lostMu.Lock()
	defer ls.lostMu.Unlock()
	return ls.lostErr
}

// revokeDetached revokes id in the background (a lease retired, or
// granted once Close had begun: no key is on it), bounded by closeWait and
// by Close's grace: a lease it could not revoke expires on the server.
func (l *Locker) revokeDetached(id clientv3.LeaseID) {
	l.life.Go(func() {
		ctx, cancel := context.WithTimeout(l.life.Abandoned(), closeWait)
		defer cancel()
		_, _ = l.cli.Revoke(ctx, id)
	})
}
