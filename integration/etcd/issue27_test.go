package etcd_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/etcd"
	"github.com/go-locker/locker/integration/testserver"
)

// releaseTTL is the lease of the Release verdict tests: long enough that
// the holder's own clock declares no loss while it is cut off (no earlier
// than TTL − TTL/3 − drift, 11s, after the cut), so that only Release's
// verdict is on trial.
const releaseTTL = 20 * time.Second

// A holder whose Release is in flight while it is cut off, and whose key is
// taken away meanwhile (deleted by an operator, or its lease revoked, as a
// deposed leader may: etcd #15247) while another client acquires the key:
// once the holder can reach the server again, its retried deletion finds
// the key gone. Nothing proves that its own attempt deleted it (the first
// never reached the server), so the verdict must be the loss: Release
// returns an error wrapping ErrLost and Err says lost. The code before the
// fix took the key's absence after an unanswered attempt for its own
// deletion and returned nil, with Err = ErrReleased.
func TestReleaseOfTakenLockIsLost(t *testing.T) {
	for _, how := range []string{"deleted", "revoked"} {
		t.Run(how, func(t *testing.T) {
			srv := testserver.Etcd(t)
			ctx := testCtx(t, time.Minute)
			admin := newEtcdClient(t, srv.Addr())
			a, b := newClient(t, srv.Addr()), newClient(t, srv.Addr())
			k := uniqueKey(t)
			h := mustAcquire(t, ctx, a.l, k, locker.WithTTL(releaseTTL))
			eh := h.(*etcd.Handle)

			a.px.Blackhole(t)
			heal := sync.OnceFunc(func() { a.px.Heal(t) })
			defer heal()
			cut := time.Now()
			released := make(chan error, 1)
			go func() { released <- h.Release(ctx) }()

			switch how {
			case "deleted":
				if _, err := admin.Delete(ctx, eh.EtcdKey()); err != nil {
					t.Fatal(err)
				}
			case "revoked":
				if _, err := admin.Revoke(ctx, eh.LeaseID()); err != nil {
					t.Fatal(err)
				}
			}
			hb, err := b.l.TryAcquire(ctx, k, locker.WithTTL(releaseTTL))
			if err != nil {
				t.Fatalf("B's TryAcquire after A's key was %s: %v", how, err)
			}
			defer hb.Release(ctx)
			select {
			case err := <-released:
				t.Fatalf("A's Release returned through a blackhole: %v", err)
			default:
			}
			// A's first deletion must have gone into the blackhole before
			// the heal (it is sent as soon as its goroutine runs); no event
			// says when it has, so give it a second, the cut of the
			// scenario.
			time.Sleep(time.Second - time.Since(cut))
			heal() // closes A's connections: its attempt in flight fails, the next reaches the server

			var rerr error
			select {
			case rerr = <-released:
			case <-time.After(30 * time.Second):
				t.Fatal("A's Release had not returned 30s after the heal")
			}
			t.Logf("A's Release after its key was %s and B acquired: %v; Err = %v", how, rerr, h.Err())
			if !errors.Is(rerr, locker.ErrLost) {
				t.Errorf("Release of a lock taken away while it was in flight = %v, want an error wrapping ErrLost", rerr)
			}
			if !errors.Is(h.Err(), locker.ErrLost) {
				t.Errorf("Err after that Release = %v, want an error wrapping ErrLost", h.Err())
			}
			if err := hb.Err(); err != nil {
				t.Errorf("B's lock ended: %v", err)
			}
			if ks := waiterKeys(t, admin, k); len(ks) != 1 || ks[0] != hb.(*etcd.Handle).EtcdKey() {
				t.Errorf("waiter keys after A's Release = %v, want only B's", ks)
			}
			if hb.Token() <= h.Token() {
				t.Errorf("B's token %d is not above A's %d", hb.Token(), h.Token())
			}
		})
	}
}

// The other side of the verdict: a Release whose deletion the server
// applied but whose answer was lost (the server's bytes dropped, then the
// connection reset) is a clean release, nil and ErrReleased, even when
// another Release on the same lease committed after it (so the latest
// release record of the lease is not its own). Two locks on one lease are
// released at once through a link that drops every answer; both deletions
// are seen applied on the server, then the link heals.
func TestReleaseWhoseAnswerWasLostIsClean(t *testing.T) {
	srv := testserver.Etcd(t)
	ctx := testCtx(t, time.Minute)
	admin := newEtcdClient(t, srv.Addr())
	a := newClient(t, srv.Addr())
	k := uniqueKey(t)
	h1 := mustAcquire(t, ctx, a.l, k+"/1", locker.WithTTL(releaseTTL))
	h2 := mustAcquire(t, ctx, a.l, k+"/2", locker.WithTTL(releaseTTL))
	if h1.(*etcd.Handle).LeaseID() != h2.(*etcd.Handle).LeaseID() {
		t.Fatal("two locks of one TTL on one Locker are on different leases")
	}
	hs := []locker.Handle{h1, h2}

	a.px.BlackholeDownstream(t)
	heal := sync.OnceFunc(func() { a.px.Heal(t) })
	defer heal()
	released := make([]chan error, len(hs))
	for i, h := range hs {
		eh := h.(*etcd.Handle)
		wch := admin.Watch(ctx, eh.EtcdKey(), clientv3.WithRev(eh.Token()+1), clientv3.WithFilterPut())
		released[i] = make(chan error, 1)
		go func() { released[i] <- h.Release(ctx) }()
		// The server applied the deletion (its answer is dropped).
		select {
		case wr := <-wch:
			if err := wr.Err(); err != nil || len(wr.Events) == 0 {
				t.Fatalf("watching %s: %v", eh.EtcdKey(), err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the deletion of %s did not reach the server", eh.EtcdKey())
		}
	}
	heal()
	for i, h := range hs {
		select {
		case err := <-released[i]:
			t.Logf("Release %d whose answer was lost: %v", i+1, err)
			if err != nil {
				t.Errorf("Release %d, whose own deletion the server applied, = %v, want nil", i+1, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("Release %d had not returned 30s after the heal", i+1)
		}
		if !errors.Is(h.Err(), locker.ErrReleased) {
			t.Errorf("Err after Release %d = %v, want ErrReleased", i+1, h.Err())
		}
	}
	// The Locker still works, and the keys are free.
	for _, kk := range []string{k + "/1", k + "/2"} {
		tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		h, err := a.l.TryAcquire(tctx, kk)
		cancel()
		if err != nil {
			t.Fatalf("TryAcquire(%q) after the releases: %v", kk, err)
		}
		_ = h.Release(ctx)
	}
}

// TryAcquire makes one attempt: against a cluster that does not answer (a
// blackhole: connections open, nothing comes back) and with no deadline of
// the caller's, it must still return, within its documented bound (three
// attempt windows of a third of the TTL each, at least 1s: 3s for a TTL of
// 3s), and with an error of its own, not ErrNotAcquired (nobody holds the
// key: the cluster did not answer). Both the lease grant (a fresh Locker)
// and the create (a Locker whose lease exists) retried while ctx lasted in
// the code before the fix, so such a TryAcquire never returned.
func TestTryAcquireUnreachableIsBounded(t *testing.T) {
	const (
		lttl  = 3 * time.Second
		bound = 3 * time.Second // 3 × attemptWait(3s) = 3 × 1s, see the package doc
		slack = 5 * time.Second // a busy machine; the cleanup's 300ms
	)
	for _, how := range []string{"fresh", "leased"} {
		t.Run(how, func(t *testing.T) {
			srv := testserver.Etcd(t)
			ctx := testCtx(t, time.Minute)
			a := newClient(t, srv.Addr(), etcd.WithDefaultTTL(lttl))
			k := uniqueKey(t)
			if how == "leased" {
				h := mustAcquire(t, ctx, a.l, k+"/warm")
				if err := h.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			a.px.Blackhole(t)
			defer a.px.Heal(t)
			start := time.Now()
			done := make(chan error, 1)
			go func() {
				h, err := a.l.TryAcquire(context.Background(), k)
				if err == nil {
					err = errors.New("<nil>: TryAcquire through a blackhole returned a lock")
					_ = h.Release(ctx)
				}
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(bound + slack):
				a.px.Heal(t)
				a.l.Close() // ends the call
				t.Fatalf("TryAcquire(context.Background()) against an unreachable cluster had not returned after %v (bound %v)", bound+slack, bound)
			}
			took := time.Since(start)
			t.Logf("TryAcquire against an unreachable cluster returned after %v: %v", took, err)
			if errors.Is(err, locker.ErrNotAcquired) {
				t.Errorf("TryAcquire against an unreachable cluster = %v: ErrNotAcquired says another holder has the key", err)
			}
		})
	}
}

// Curator's killed-session test: one Locker holds a key and waits for it
// again (locks are not reentrant), and its connection is cut for longer
// than its lease while another client waits too. The holder must report
// the loss, before the other client holds the key; the Locker's own waiter
// must fail on its own (its context lasts a minute), or, should it return
// a lock, hold it for real: its key is the oldest of the directory and the
// other client does not hold at the same time.
func TestKilledSessionHolderAndWaiter(t *testing.T) {
	srv := testserver.Etcd(t)
	ctx := testCtx(t, time.Minute)
	admin := newEtcdClient(t, srv.Addr())
	a, b := newClient(t, srv.Addr()), newClient(t, srv.Addr())
	k := uniqueKey(t)
	h := mustAcquire(t, ctx, a.l, k, locker.WithTTL(ttl))
	waiter := goAcquire(ctx, a.l, k, locker.WithTTL(ttl))
	waitKeys(t, admin, k, 2)
	other := goAcquire(ctx, b.l, k, locker.WithTTL(ttl))
	waitKeys(t, admin, k, 3)

	cut := time.Now()
	a.px.Partition(t)
	heal := sync.OnceFunc(func() { a.px.Heal(t) })
	defer heal()

	// B gets the key once the server expires A's lease (A's keys go with
	// it); by then A's holder must have reported the loss.
	var rb result
	select {
	case rb = <-other:
	case <-time.After(3*ttl + 5*time.Second):
		t.Fatalf("B did not acquire within %v of A's cut", 3*ttl+5*time.Second)
	}
	if rb.err != nil {
		t.Fatalf("B: %v", rb.err)
	}
	defer rb.h.Release(ctx)
	if !closed(h.Done()) || !errors.Is(h.Err(), locker.ErrLost) {
		t.Errorf("B holds the key (%v after the cut) while A's holder has not reported the loss (Err %v)", rb.at.Sub(cut), h.Err())
	}
	// The waiter fails on its own: its lease is gone, not its context.
	var rw result
	select {
	case rw = <-waiter:
	case <-time.After(3*ttl + 5*time.Second):
		t.Fatalf("A's waiter, whose lease expired %v ago, is still waiting (its context lasts a minute)", time.Since(cut))
	}
	heal()
	t.Logf("cut at 0: A's holder lost (%v); B held at %v; A's waiter returned at %v: %v", h.Err(), rb.at.Sub(cut), rw.at.Sub(cut), rw.err)
	if rw.err == nil {
		defer rw.h.Release(ctx)
		if ks := waiterKeys(t, admin, k); len(ks) == 0 || ks[0] != rw.h.(*etcd.Handle).EtcdKey() {
			t.Errorf("A's waiter returned a lock it does not hold (keys %v) while B holds %s", ks, rb.h.(*etcd.Handle).EtcdKey())
		}
		if rb.h.Err() == nil {
			t.Errorf("A's waiter and B both hold the key")
		}
	} else if errors.Is(rw.err, context.DeadlineExceeded) || errors.Is(rw.err, context.Canceled) {
		t.Errorf("A's waiter failed by its context (%v), not on its own", rw.err)
	}
	if err := rb.h.Err(); err != nil {
		t.Errorf("B's lock ended: %v", err)
	}
	// A works again after the heal.
	if err := rb.h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	h2 := mustAcquire(t, ctx, a.l, k, locker.WithTTL(ttl))
	if h2.Token() <= rb.h.Token() {
		t.Errorf("token %d after the heal is not above B's %d", h2.Token(), rb.h.Token())
	}
	_ = h2.Release(ctx)
}
