package zookeeper_test

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/zookeeper"
)

// A waiting Acquire whose session ends under it (killed on the server,
// Curator's KillSession) while one of its requests is on the way. The
// waiter's node went with the session, so the Acquire must start over in
// the Locker's next session, not fail: it is still waiting, and gets the
// key once the holder releases it. (The server closes the old connection
// as the session is taken over, so the request in flight ends with
// "connection closed"; the rarer answer "session expired", for a request
// the server processes while it closes the session, is handled the same
// way: see sessionEnded in the package.)
func TestWaiterAcrossSessionExpiry(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	admin := adminConn(t, srv.Addr())
	relay := newSessionRelay(t, srv.Addr())
	a := newClient(t, relay.addr) // through its proxy, then the relay
	b, c := newClient(t, srv.Addr()), newClient(t, srv.Addr())
	ctx := ctxFor(t, time.Minute)
	k := testKey(t)

	hb := mustAcquire(t, ctx, b.l, k)
	// c waits first, a after it: a watches c's node (and b's).
	cctx, ccancel := context.WithCancel(ctx)
	cDone := make(chan error, 1)
	go func() {
		h, err := c.l.Acquire(cctx, k)
		if err == nil {
			_ = h.Release(context.Background())
		}
		cDone <- err
	}()
	waitNodes(t, admin, k, 10*time.Second, "c never queued", func(kids []string) bool { return len(kids) == 2 })
	type res struct {
		h   *zookeeper.Handle
		err error
	}
	aGot := make(chan res, 1)
	go func() {
		h, err := a.l.Acquire(ctx, k)
		if err != nil {
			aGot <- res{nil, err}
			return
		}
		aGot <- res{h.(*zookeeper.Handle), nil}
	}()
	waitNodes(t, admin, k, 10*time.Second, "a never queued", func(kids []string) bool { return len(kids) == 3 })
	// The session a queued in (its only one so far).
	sid := a.l.Conn().SessionID()
	// Give a's waiter time to set its watches on c's and b's nodes (they go
	// out after its listing; nothing on the shared server says when they
	// are in). The verdict does not depend on it: it only makes a request
	// in flight at the kill likely.
	time.Sleep(300 * time.Millisecond)

	// The server stops hearing a; a still hears the server. c gives up:
	// a's waiter hears its predecessor went, with b's node still before
	// its own, and lists the directory again: that request is held.
	a.px.CutUpstream(t)
	ccancel()
	if err := <-cDone; err == nil {
		t.Fatal("c got the key while b held it")
	}
	waitNodes(t, admin, k, 10*time.Second, "c's node stayed", func(kids []string) bool { return len(kids) == 2 })
	time.Sleep(200 * time.Millisecond) // a's listing goes out (and is held)
	// The session is killed; then a's held requests reach the server on
	// a's old connection, in a session that is closed.
	killSession(t, srv.Addr(), sid, relay.password(t, sid))
	a.px.Heal(t)

	// a's waiter must still wait (b holds the key)...
	select {
	case r := <-aGot:
		if r.err != nil {
			t.Fatalf("a's Acquire failed when its session ended under it, instead of starting over in a new session: %v", r.err)
		}
		t.Fatalf("a got the key while b held it (node %s)", r.h.Node())
	case <-time.After(2 * sessionTimeout):
	}
	// ...and get the key once b releases it, in a new session.
	if err := hb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-aGot:
		if r.err != nil {
			t.Fatalf("a's Acquire after b's release: %v", r.err)
		}
		if r.h.SessionID() == sid {
			t.Errorf("a holds in the killed session %#x", sid)
		}
		if r.h.Token() <= hb.Token() {
			t.Errorf("a's token %d not above b's %d", r.h.Token(), hb.Token())
		}
		if err := r.h.Release(ctx); err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a never got the key after b released it")
	}
}

// A second node with a waiter's GUID after its own (what a create retried
// after a lost answer leaves on an ensemble, when the listing that looked
// for the first attempt's node ran on a server that had not applied it
// yet, and the first attempt landed after the second): the waiter deletes
// it at its next listing. Left there, it would block every later waiter
// once the waiter is done, until the session that made it ends. Here the
// duplicate is planted by another session, which stays alive.
func TestDuplicateNodeAfterOwnDeleted(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	admin := adminConn(t, srv.Addr())
	a, b, c, d := newClient(t, srv.Addr()), newClient(t, srv.Addr()), newClient(t, srv.Addr()), newClient(t, srv.Addr())
	ctx := ctxFor(t, time.Minute)
	k := testKey(t)
	dir := zookeeper.LockDir("", k)

	hb := mustAcquire(t, ctx, b.l, k)
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	cDone := make(chan error, 1)
	go func() {
		h, err := c.l.Acquire(cctx, k)
		if err == nil {
			_ = h.Release(context.Background())
		}
		cDone <- err
	}()
	waitNodes(t, admin, k, 10*time.Second, "c never queued", func(kids []string) bool { return len(kids) == 2 })
	type res struct {
		h   locker.Handle
		err error
	}
	aGot := make(chan res, 1)
	go func() {
		h, err := a.l.Acquire(ctx, k)
		aGot <- res{h, err}
	}()
	kids := waitNodes(t, admin, k, 10*time.Second, "a never queued", func(kids []string) bool { return len(kids) == 3 })
	// The sequence is the last ten digits: a's node is the third.
	slices.SortFunc(kids, func(x, y string) int { return strings.Compare(x[len(x)-10:], y[len(y)-10:]) })
	aNode := kids[2]
	prefix := aNode[:len(aNode)-10] // "_c_<guid>-lock-"
	dup, err := admin.Create(dir+"/"+prefix, nil, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a's node %s, planted duplicate %s", aNode, path.Base(dup))
	// c gives up: a's predecessor goes with b's node still before a's, so
	// a lists the directory again, and finds the duplicate.
	ccancel()
	<-cDone
	waitNodes(t, admin, k, 10*time.Second, "the duplicate of a's node after its own was never deleted", func(kids []string) bool {
		return !slices.Contains(kids, path.Base(dup))
	})
	// So once a is done, the next waiter gets the key.
	dGot := make(chan error, 1)
	go func() {
		h, err := d.l.Acquire(ctx, k)
		if err == nil {
			err = h.Release(ctx)
		}
		dGot <- err
	}()
	if err := hb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	ra := <-aGot
	if ra.err != nil {
		t.Fatalf("a's Acquire: %v", ra.err)
	}
	if err := ra.h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-dGot:
		if err != nil {
			t.Fatalf("d's Acquire: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("d never got the key after a released it")
	}
}

// A waiter whose own node and predecessor both go while its connection is
// down, the session surviving: on the reconnect go-zookeeper sets the old
// watches again in no particular order, and the server fires both at once,
// so the news of the predecessor may come before that of the waiter's own
// node. The waiter must not take the lock on that news (its node is gone,
// and the next waiter holds): it lists again, finds its node gone, and
// queues anew. Run on several keys, as the order is random.
func TestWaiterReArmedWatchesOutOfOrder(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	admin := adminConn(t, srv.Addr())
	ctx := ctxFor(t, 2*time.Minute)
	for round := range 6 {
		a, b, c := newClient(t, srv.Addr()), newClient(t, srv.Addr()), newClient(t, srv.Addr())
		k := fmt.Sprintf("%s/%d", testKey(t), round)
		hb := mustAcquire(t, ctx, b.l, k)
		type res struct {
			h   locker.Handle
			err error
			at  time.Time
		}
		aGot := make(chan res, 1)
		go func() {
			h, err := a.l.Acquire(ctx, k)
			aGot <- res{h, err, time.Now()}
		}()
		kids := waitNodes(t, admin, k, 10*time.Second, "a never queued", func(kids []string) bool { return len(kids) == 2 })
		slices.SortFunc(kids, func(x, y string) int { return strings.Compare(x[len(x)-10:], y[len(y)-10:]) })
		aNode := zookeeper.LockDir("", k) + "/" + kids[1]
		cGot := make(chan res, 1)
		go func() {
			h, err := c.l.Acquire(ctx, k)
			cGot <- res{h, err, time.Now()}
		}()
		waitNodes(t, admin, k, 10*time.Second, "c never queued", func(kids []string) bool { return len(kids) == 3 })
		// a's watches on b's node and its own go out after its listing;
		// nothing on the shared server says when they are in.
		time.Sleep(200 * time.Millisecond)

		a.px.Blackhole(t) // what the server sends meanwhile is lost
		if err := admin.Delete(aNode, -1); err != nil {
			t.Fatal(err)
		}
		if err := hb.Release(ctx); err != nil {
			t.Fatal(err)
		}
		rc := <-cGot
		if rc.err != nil {
			t.Fatalf("round %d: c's Acquire: %v", round, rc.err)
		}
		a.px.Heal(t) // the connection is reset: a reconnects in its session
		select {
		case ra := <-aGot:
			if ra.err == nil {
				t.Fatalf("round %d: a holds the key (its node deleted while it was cut off) while c holds it", round)
			}
			t.Fatalf("round %d: a's Acquire failed: %v", round, ra.err)
		case <-time.After(sessionTimeout):
		}
		if err := rc.h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case ra := <-aGot:
			if ra.err != nil {
				t.Fatalf("round %d: a's Acquire after c released: %v", round, ra.err)
			}
			if err := ra.h.Release(ctx); err != nil {
				t.Fatal(err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: a never got the key after c released it", round)
		}
	}
}
