package zookeeper_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/zookeeper"
)

// The server of these tests grants at most maxGranted, far below what the
// Locker under test asks for (askedLong).
const (
	maxGranted = 1600 * time.Millisecond
	askedLong  = 10 * time.Second
)

// shortSessionServer starts a ZooKeeper server whose maxSessionTimeout is
// maxGranted.
func shortSessionServer(t *testing.T) *testserver.Server {
	t.Helper()
	return testserver.NewZooKeeperWith(t, fmt.Sprintf("maxSessionTimeout=%d", maxGranted.Milliseconds()),
		"4lw.commands.whitelist=ruok,srvr,stat,wchc")
}

// watchedBy returns the paths session sid watches on the server at addr
// (the four-letter command wchc).
func watchedBy(t *testing.T, addr string, sid int64) map[string]bool {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("wchc")); err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("wchc: %v", err)
	}
	if strings.Contains(string(out), "not in the whitelist") {
		t.Fatalf("wchc: %s", out)
	}
	paths := map[string]bool{}
	in := false
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(line, "0x"):
			id, err := strconv.ParseUint(strings.TrimSpace(line[2:]), 16, 64)
			in = err == nil && int64(id) == sid
		case in && strings.TrimSpace(line) != "":
			paths[strings.TrimSpace(line)] = true
		}
	}
	return paths
}

// connectAskingLong connects a Locker that asks for askedLong, and checks
// that the server granted maxGranted (so that zoo.cfg took effect).
func connectAskingLong(t *testing.T, addr string) client {
	t.Helper()
	c := newClient(t, addr, zookeeper.WithDefaultTTL(askedLong))
	if got := c.l.SessionTimeout(); got != maxGranted {
		t.Fatalf("SessionTimeout() = %v after asking %v of a server with maxSessionTimeout=%v: want the granted %v", got, askedLong, maxGranted, maxGranted)
	}
	return c
}

// A server that grants a much shorter session than asked (its
// maxSessionTimeout): every deadline of the Locker must come from the
// granted timeout, from the first moment. Here the holder is cut off one
// way (the server stops hearing it, its watch notifications still come in,
// so go-zookeeper never times the connection out) right after it
// connected: only the Locker's lease check can tell it the session is
// about to expire, and it must do so before another client gets the key.
// Decided by order: when c holds the key, a's handle must already be Done
// with ErrLost.
func TestGrantedSessionShorterThanAsked(t *testing.T) {
	srv := shortSessionServer(t)
	admin := adminConn(t, srv.Addr())
	b, c := newClient(t, srv.Addr()), newClient(t, srv.Addr())
	ctx := ctxFor(t, time.Minute)
	k := testKey(t)

	// b holds keys that a will wait for: each release b makes sends a watch
	// notification down a's connection, for a few granted timeouts.
	const notifiers = 24
	var held []*zookeeper.Handle
	for i := range notifiers {
		held = append(held, mustAcquire(t, ctx, b.l, fmt.Sprintf("%s/w%d", k, i)))
	}

	a := connectAskingLong(t, srv.Addr())
	connected := time.Now()
	wctx, wcancel := context.WithCancel(ctx)
	var waiters sync.WaitGroup
	t.Cleanup(func() { wcancel(); waiters.Wait() })
	for i := range notifiers {
		waiters.Add(1)
		go func() {
			defer waiters.Done()
			if h, err := a.l.Acquire(wctx, fmt.Sprintf("%s/w%d", k, i)); err == nil {
				rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = h.Release(rctx)
				cancel()
			}
		}()
	}
	hA := mustAcquire(t, ctx, a.l, k)
	for i := range notifiers {
		wk := fmt.Sprintf("%s/w%d", k, i)
		waitNodes(t, admin, wk, 10*time.Second, "a's waiter on "+wk+" never queued",
			func(kids []string) bool { return len(kids) >= 2 })
	}
	// Every waiter of a has its watch on b's node (the server says so):
	// each release below is one notification to a.
	for deadline := time.Now().Add(10 * time.Second); ; {
		w := watchedBy(t, srv.Addr(), hA.SessionID())
		missing := 0
		for _, h := range held {
			if !w[h.Node()] {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s, %d of a's %d waiters have no watch on b's node", missing, notifiers)
		}
		time.Sleep(20 * time.Millisecond) // nothing to wait on: the server only answers when asked
	}

	race := cutHolder(t, ctx, a, c, hA, k)
	t.Logf("cut %v after a connected (a first checks its lease at the asked timeout / 3 = %v after connecting, before the fix)",
		race.cut.Sub(connected).Round(time.Millisecond), askedLong/3)

	// Notifications keep coming (one every granted/10, well within
	// go-zookeeper's receive timeout of two thirds of the granted timeout)
	// until shortly before the server may expire the session; then nothing
	// passes either way, not even the end of the connection
	// (SilenceDownstream), so that a cannot learn of the expiry from the
	// server (its connection closed, its node deleted): only its own lease
	// can tell it in time. go-zookeeper would time the connection out a
	// receive timeout after the last notification, after c got the key.
	for _, h := range held {
		if time.Since(race.cut) > maxGranted*7/8 {
			break
		}
		if err := h.Release(ctx); err != nil {
			t.Fatalf("b's release of a notifier key: %v", err)
		}
		time.Sleep(maxGranted / 10)
	}
	a.px.SilenceDownstream(t)
	race.check(t, hA, fmt.Sprintf("granted session %v", maxGranted))
}

// TryAcquire makes one attempt: on a Locker that has no session, it waits
// for one at most a session timeout, the granted one (not the asked one,
// which may be far longer). Decided by order: the attempt must fail on its
// own before the caller's context, longer than the granted timeout but
// shorter than the asked one, ends.
func TestGrantedSessionBoundsTryAcquire(t *testing.T) {
	srv := shortSessionServer(t)
	a := connectAskingLong(t, srv.Addr())
	ctx := ctxFor(t, time.Minute)
	k := testKey(t)
	h := mustAcquire(t, ctx, a.l, k)
	a.px.Blackhole(t)
	defer a.px.Heal(t)
	// The holder's loss says the Locker knows it is disconnected.
	select {
	case <-h.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the holder never reported the loss of its cut-off session")
	}
	tctx, cancel := context.WithTimeout(ctx, askedLong*6/10)
	defer cancel()
	start := time.Now()
	g, err := a.l.TryAcquire(tctx, k+"/other")
	took := time.Since(start)
	if err == nil {
		_ = g.Release(ctx)
		t.Fatal("TryAcquire succeeded on a cut-off Locker")
	}
	if tctx.Err() != nil {
		t.Fatalf("TryAcquire without a session returned after %v, only when the caller's context ended (%v): want it to give up after the granted session timeout %v: %v",
			took.Round(time.Millisecond), askedLong*6/10, maxGranted, err)
	}
	if errors.Is(err, locker.ErrNotAcquired) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryAcquire without a session: %v, want an error of its own (not ErrNotAcquired, nor a context error: the caller's context has not ended)", err)
	}
	t.Logf("TryAcquire without a session gave up after %v: %v", took.Round(time.Millisecond), err)
}

// TryAcquire makes one attempt, bounded even when the connection breaks
// in the middle of it: here the Locker still counts itself connected when
// the attempt starts, its create goes into a partition that lasts, and the
// attempt must fail on its own (one session timeout after it began, say),
// not wait for a session until the caller's context ends.
func TestTryAcquireBoundedInPartition(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	a := newClient(t, srv.Addr())
	ctx := ctxFor(t, time.Minute)
	k := testKey(t)
	settleDir(t, ctx, a.l, k)
	a.px.Partition(t)
	defer a.px.Heal(t)
	limit := 6 * sessionTimeout
	tctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	start := time.Now()
	h, err := a.l.TryAcquire(tctx, k)
	took := time.Since(start)
	if err == nil {
		_ = h.Release(ctx)
		t.Fatal("TryAcquire succeeded in a partition")
	}
	if tctx.Err() != nil {
		t.Fatalf("TryAcquire in a partition returned only when the caller's context ended (%v): one attempt must be bounded by the Locker: %v", limit, err)
	}
	if errors.Is(err, locker.ErrNotAcquired) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryAcquire in a partition: %v, want an error of its own (not ErrNotAcquired, nor a context error)", err)
	}
	t.Logf("TryAcquire in a partition gave up after %v: %v", took.Round(time.Millisecond), err)
}
