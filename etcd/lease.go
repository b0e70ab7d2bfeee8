package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
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
	granted time.Duration // the TTL the server granted

	lost    chan struct{} // closed once the lease is given up
	lostMu  sync.Mutex
	lostErr string
	ended   bool
	handles map[*Handle]struct{}
	stop    chan struct{} // closed by Close: stop renewing
	stopped sync.Once
}

// leaseFor returns the Locker's live lease for ttl, granting one when there
// is none.
func (l *Locker) leaseFor(ctx context.Context, ttl time.Duration) (*lease, error) {
	ttl = time.Duration(leaseSeconds(ttl)) * time.Second
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, errClosed
		}
		ls := l.leases[ttl]
		mine := ls == nil
		if mine {
			ls = &lease{l: l, ttl: ttl, ready: make(chan struct{}), lost: make(chan struct{}),
				handles: map[*Handle]struct{}{}, stop: make(chan struct{})}
			l.leases[ttl] = ls
		}
		l.mu.Unlock()
		if mine {
			ls.grant(ctx)
		}
		select {
		case <-ls.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if ls.err == nil {
			select {
			case <-ls.lost:
				continue // given up since: a fresh one
			default:
				return ls, nil
			}
		}
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
	sent := time.Now()
	resp, err := l.cli.Grant(ctx, leaseSeconds(ls.ttl))
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
	ls.granted = time.Duration(resp.TTL) * time.Second
	l.mu.Lock()
	closed := l.closed
	if !closed {
		l.bg.Add(1)
	}
	l.mu.Unlock()
	if closed {
		// Close has run or is running: give the lease back ourselves.
		ls.err = errClosed
		close(ls.ready)
		l.revokeDetached(ls.id)
		return
	}
	close(ls.ready)
	go ls.keepAlive(sent)
}

// deadline is the latest moment the lease can be trusted after a renewal
// sent at sent (or the grant) was answered with ttl: the server restarts
// its clock when the request arrives, after sent; the drift margin covers
// the rate difference of the two clocks.
func (ls *lease) deadline(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - ls.l.cfg.driftMargin(ttl))
}

// keepAlive renews the lease every third of its TTL, and gives it up when
// no renewal has been confirmed by the deadline (measured on the client's
// own monotonic clock, so a member that hangs or a partition cannot delay
// the report) or the server says the lease is gone.
func (ls *lease) keepAlive(sent time.Time) {
	l := ls.l
	defer l.bg.Done()
	interval := min(ls.ttl, ls.granted) / 3
	dl := time.NewTimer(time.Until(ls.deadline(sent, ls.granted)))
	defer dl.Stop()
	type result struct {
		resp *clientv3.LeaseKeepAliveResponse
		err  error
	}
	next := sent.Add(interval)
	for {
		wait := time.NewTimer(time.Until(next))
		select {
		case <-wait.C:
		case <-dl.C:
			wait.Stop()
			ls.lose("the lease was not renewed in time (the server could not be reached)")
			return
		case <-ls.stop:
			wait.Stop()
			return
		case <-l.bgCtx.Done():
			wait.Stop()
			return
		}
		sent = time.Now()
		next = sent.Add(interval)
		ctx, cancel := context.WithTimeout(l.bgCtx, interval)
		res := make(chan result, 1)
		l.bg.Add(1)
		go func() {
			defer l.bg.Done()
			r, err := l.cli.KeepAliveOnce(ctx, ls.id)
			res <- result{r, err}
		}()
		select {
		case r := <-res:
			cancel()
			switch {
			case r.err == nil && r.resp.TTL > 0:
				dl.Reset(time.Until(ls.deadline(sent, time.Duration(r.resp.TTL)*time.Second)))
			case r.err == nil || errors.Is(r.err, rpctypes.ErrLeaseNotFound):
				ls.lose("the lease expired or was revoked on the server")
				return
			default:
				// Not answered: try again soon, the deadline decides.
				next = time.Now().Add(min(interval, 200*time.Millisecond))
			}
		case <-dl.C:
			cancel()
			ls.lose("the lease was not renewed in time (the server did not answer)")
			return
		case <-ls.stop:
			cancel()
			return
		case <-l.bgCtx.Done():
			cancel()
			return
		}
	}
}

// lose gives the lease up: every lock on it is lost, waits on it fail, and
// the Locker grants a new lease for later locks. The keys on it go when
// the server expires it (it is no longer renewed).
func (ls *lease) lose(why string) {
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
	close(ls.lost)
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

// revokeDetached revokes id in the background, bounded by closeWait.
func (l *Locker) revokeDetached(id clientv3.LeaseID) {
	l.calls.Add(1)
	go func() {
		defer l.calls.Done()
		ctx, cancel := context.WithTimeout(context.Background(), closeWait)
		defer cancel()
		_, _ = l.cli.Revoke(ctx, id)
	}()
}
