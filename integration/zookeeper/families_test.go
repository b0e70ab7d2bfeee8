package zookeeper_test

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/zookeeper"
)

// Semaphores and reader-writer locks on ZooKeeper beyond the conformance
// suite: who is woken by what (no herd, the relay of a semaphore's queue),
// and the faults where the recipes have a window: a permit holder cut off,
// a waiter whose session lapses in the middle of the queue, nodes deleted
// on the server.

// counted is a Locker on a connection whose watch events and requests are
// counted (New on the caller's connection, as TestHerd's).
type counted struct {
	l      *zookeeper.Locker
	events atomic.Int64 // watch events, not session ones
	reqs   requestCounter
}

func newCounted(t *testing.T, addr string) *counted {
	t.Helper()
	c := &counted{}
	conn, events, err := zk.Connect([]string{addr}, sessionTimeout, zk.WithLogger(quiet{}),
		zk.WithEventCallback(func(ev zk.Event) {
			if ev.Type != zk.EventSession && ev.Type != zk.EventNotWatching {
				c.events.Add(1)
			}
		}),
		zk.WithDialer(c.reqs.dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	c.l = zookeeper.New(conn, events, zookeeper.WithSessionTimeout(sessionTimeout))
	t.Cleanup(func() { _ = c.l.Close() })
	return c
}

// settled reports whether c has sent at least getData getData requests
// (GetW: its watches) and had every request answered.
func (c *counted) settled(getData int64) bool {
	sent, answered := c.reqs.counts()
	return c.reqs.getData.Load() >= getData && answered == sent
}

// until polls cond, which reads counters that only grow, for up to 20s.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 20s: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

type acquired struct {
	i   int
	h   locker.Handle
	err error
	at  time.Time
}

// goAcquire runs acquire in the background and reports its result on ch,
// tagged i.
func goAcquire(ch chan<- acquired, i int, acquire func() (locker.Handle, error)) {
	go func() {
		h, err := acquire()
		ch <- acquired{i, h, err, time.Now()}
	}()
}

// No herd, and the relay: a semaphore of 3 with 12 waiters queued in
// order. Holders release out of order; each release wakes the first waiter
// only (its watch on the n holders), which takes the permit with one
// listing and one write (the relay), and that write wakes the waiter after
// it, which becomes the first and watches the n holders. No other waiter
// hears anything or sends a request; permits go first come, first served.
func TestSemaphoreNoHerd(t *testing.T) {
	const n, waiters = 3, 12
	srv := testserver.ZooKeeper(t)
	admin := adminConn(t, srv.Addr())
	ctx := ctxFor(t, 2*time.Minute)
	k := testKey(t)
	dir := zookeeper.SemaphoreDir("", k)
	cs := make([]*counted, n+waiters)
	for i := range cs {
		cs[i] = newCounted(t, srv.Addr())
	}
	holders := make([]int, 0, n) // indices into cs, in the order they got in
	handles := map[int]locker.Handle{}
	for i := range n {
		// Acquire, not TryAcquire: a New Locker's first call waits for its
		// check of the session timeout, which one attempt bounds.
		h, err := cs[i].l.AcquireSemaphore(ctx, k, n)
		if err != nil {
			t.Fatalf("permit %d of %d: %v", i+1, n, err)
		}
		holders, handles[i] = append(holders, i), h
	}
	res := make(chan acquired, waiters)
	for i := n; i < len(cs); i++ {
		goAcquire(res, i, func() (locker.Handle, error) { return cs[i].l.AcquireSemaphore(ctx, k, n) })
		waitDir(t, admin, dir, 10*time.Second, fmt.Sprintf("waiter %d queued", i), func(kids []string) bool { return len(kids) == i+1 })
	}
	// Every waiter has watched what it needs: the first one the n holders,
	// the others their predecessor.
	until(t, "the waiters never all watched", func() bool {
		for i := n; i < len(cs); i++ {
			if want := map[bool]int64{true: n, false: 1}[i == n]; !cs[i].settled(want) {
				return false
			}
		}
		return true
	})
	waiting := make([]int, 0, waiters) // in queue order
	for i := n; i < len(cs); i++ {
		waiting = append(waiting, i)
	}
	var lastToken int64
	for _, h := range handles {
		lastToken = max(lastToken, h.Token())
	}
	for round := 0; len(waiting) > 0; round++ {
		events := make([]int64, len(cs))
		sent := make([]int64, len(cs))
		gets := make([]int64, len(cs))
		for i, c := range cs {
			events[i] = c.events.Load()
			sent[i], _ = c.reqs.counts()
			gets[i] = c.reqs.getData.Load()
		}
		// Out of order: the newest holder, then the oldest, by turns.
		pick := len(holders) - 1
		if round%2 == 1 {
			pick = 0
		}
		gone := holders[pick]
		holders = slices.Delete(holders, pick, pick+1)
		if err := handles[gone].Release(ctx); err != nil {
			t.Fatal(err)
		}
		delete(handles, gone)
		var r acquired
		select {
		case r = <-res:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: no waiter got the permit released by %d", round, gone)
		}
		if r.err != nil {
			t.Fatalf("round %d: waiter %d: %v", round, r.i, r.err)
		}
		if r.i != waiting[0] {
			t.Errorf("round %d: waiter %d got the permit; the first in line was %d", round, r.i, waiting[0])
		}
		if r.h.Token() <= lastToken {
			t.Errorf("round %d: token %d not above the last permit's %d", round, r.h.Token(), lastToken)
		}
		lastToken = r.h.Token()
		waiting = slices.DeleteFunc(waiting, func(i int) bool { return i == r.i })
		holders, handles[r.i] = append(holders, r.i), r.h
		if d := cs[r.i].events.Load() - events[r.i]; d != 1 {
			t.Errorf("round %d: %d watch events for the new holder, want 1 (the release)", round, d)
		}
		// Its turn took a listing; then it writes its node (the relay) and,
		// once that is done, watches it (a getData, not counted here: it
		// may go out before this look or after).
		if m, _ := cs[r.i].reqs.counts(); m-sent[r.i]-(cs[r.i].reqs.getData.Load()-gets[r.i]) > 2 {
			t.Errorf("round %d: the new holder sent %d requests (besides watches) since the release, want 2 at most (a listing, the relay's write)", round, m-sent[r.i]-(cs[r.i].reqs.getData.Load()-gets[r.i]))
		}
		if len(waiting) > 0 {
			// The relay: the next in line hears the new holder's write and
			// becomes the first waiter, watching the n holders.
			next := waiting[0]
			until(t, fmt.Sprintf("round %d: waiter %d, next in line, never watched the holders", round, next), func() bool {
				return cs[next].events.Load() > events[next] && cs[next].settled(gets[next]+n)
			})
			if d := cs[next].events.Load() - events[next]; d != 1 {
				t.Errorf("round %d: %d watch events for the next in line, want 1 (the relay)", round, d)
			}
		}
		for _, i := range waiting[min(1, len(waiting)):] {
			m, _ := cs[i].reqs.counts()
			if d := cs[i].events.Load() - events[i]; d != 0 || m != sent[i] {
				t.Errorf("round %d: waiter %d, not next in line, had %d watch events and sent %d requests; want none (a herd)", round, i, d, m-sent[i])
			}
		}
		select {
		case extra := <-res:
			t.Fatalf("round %d: a second waiter (%d) got a permit for one release", round, extra.i)
		default:
		}
	}
	for _, h := range handles {
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitDir(t, admin, dir, 10*time.Second, "the directory empties", func(kids []string) bool { return len(kids) == 0 })
}

// A waiter in the middle of a semaphore's queue whose session lapses (its
// client cut off past the session timeout): the server deletes its node,
// and the waiter that watched it (for its going, or its relay write) moves
// up, and gets the permit when it frees; the lapsed waiter's Acquire goes
// on in a new session, at the back of the queue.
func TestSemaphoreWaiterSessionLapses(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	admin := adminConn(t, srv.Addr())
	a, b, c := newClient(t, srv.Addr()), newClient(t, srv.Addr()), newClient(t, srv.Addr())
	ctx := ctxFor(t, time.Minute)
	k := testKey(t)
	dir := zookeeper.SemaphoreDir("", k)
	hA, err := a.l.TryAcquireSemaphore(ctx, k, 1)
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan acquired, 2)
	goAcquire(res, 1, func() (locker.Handle, error) { return b.l.AcquireSemaphore(ctx, k, 1) })
	waitDir(t, admin, dir, 10*time.Second, "b queued", func(kids []string) bool { return len(kids) == 2 })
	goAcquire(res, 2, func() (locker.Handle, error) { return c.l.AcquireSemaphore(ctx, k, 1) })
	kids := waitDir(t, admin, dir, 10*time.Second, "c queued", func(kids []string) bool { return len(kids) == 3 })
	// b's node: the one that is neither a's nor the newest (c's).
	slices.SortFunc(kids, func(x, y string) int { return compareSeq(x, y) })
	bNode := kids[1]
	b.px.Blackhole(t)
	waitDir(t, admin, dir, 4*sessionTimeout, "b's session expired, and its node with it", func(kids []string) bool {
		return len(kids) == 2 && !slices.Contains(kids, bNode)
	})
	b.px.Heal(t)
	// b queues again, behind c.
	waitDir(t, admin, dir, 4*sessionTimeout, "b queued again", func(kids []string) bool { return len(kids) == 3 })
	released := time.Now()
	if err := hA.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var r acquired
	select {
	case r = <-res:
	case <-time.After(10 * time.Second):
		t.Fatal("nobody got the permit a released: c, which watched b's node, was not woken when it went")
	}
	if r.err != nil || r.i != 2 {
		t.Fatalf("after a's release: client %d got %v, %v; want c (2), which queued before b queued again", r.i, r.h, r.err)
	}
	t.Logf("c got the permit %v after a's release", r.at.Sub(released).Round(time.Millisecond))
	if r.h.Token() <= hA.Token() {
		t.Errorf("c's token %d not above a's %d", r.h.Token(), hA.Token())
	}
	select {
	case rb := <-res:
		t.Fatalf("b got a permit while c holds the only one: %v %v", rb.h, rb.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := r.h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rb := <-res
	if rb.err != nil {
		t.Fatalf("b, whose session lapsed while it waited: %v, want the permit in its new session", rb.err)
	}
	if rb.h.Token() <= r.h.Token() {
		t.Errorf("b's token %d not above c's %d", rb.h.Token(), r.h.Token())
	}
	if err := rb.h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// compareSeq orders lock node names by their sequence (the last 10
// characters; none of these wrapped).
func compareSeq(x, y string) int {
	xs, ys := x[len(x)-10:], y[len(y)-10:]
	switch {
	case xs < ys:
		return -1
	case xs > ys:
		return 1
	}
	return 0
}

// A permit holder cut off from the server (nothing passes either way):
// it reports the loss before the permit goes to the waiter, which gets it
// once the server expires the holder's session, with a greater token; the
// other holder keeps its permit.
func TestPermitHolderCut(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	a, b, c := newClient(t, srv.Addr()), newClient(t, srv.Addr()), newClient(t, srv.Addr())
	ctx := ctxFor(t, time.Minute)
	k := testKey(t)
	hA, err := a.l.TryAcquireSemaphore(ctx, k, 2)
	if err != nil {
		t.Fatal(err)
	}
	hB, err := b.l.TryAcquireSemaphore(ctx, k, 2)
	if err != nil {
		t.Fatal(err)
	}
	lost := make(chan time.Time, 1)
	go func() {
		<-hA.Done()
		lost <- time.Now()
	}()
	res := make(chan acquired, 1)
	goAcquire(res, 0, func() (locker.Handle, error) { return c.l.AcquireSemaphore(ctx, k, 2) })
	mustNotTry(t, ctx, c.l, k, 2)
	answeredBeforeCut(t, ctx, a.l, k)
	a.px.Blackhole(t)
	cut := time.Now()
	defer a.px.Heal(t)
	var r acquired
	select {
	case r = <-res:
	case <-time.After(4 * sessionTimeout):
		t.Fatalf("c never got the permit of a holder cut off %v ago", time.Since(cut))
	}
	if r.err != nil {
		t.Fatalf("c: %v", r.err)
	}
	var lostAt time.Time
	select {
	case lostAt = <-lost:
	default:
		t.Fatalf("c holds a permit since +%v after the cut, and the cut holder's Done() was still open", r.at.Sub(cut).Round(time.Millisecond))
	}
	if !errors.Is(hA.Err(), locker.ErrLost) {
		t.Errorf("the cut holder's Err() = %v, want ErrLost", hA.Err())
	}
	t.Logf("the cut holder reported the loss at +%v, c got the permit at +%v (lease %v)",
		lostAt.Sub(cut).Round(time.Millisecond), r.at.Sub(cut).Round(time.Millisecond), hA.(*zookeeper.Handle).TTL())
	if !lostAt.Before(r.at) {
		t.Errorf("the loss was reported at +%v, after c got the permit at +%v", lostAt.Sub(cut), r.at.Sub(cut))
	}
	if r.h.Token() <= hA.Token() || r.h.Token() <= hB.Token() {
		t.Errorf("c's token %d not above the holders' %d and %d", r.h.Token(), hA.Token(), hB.Token())
	}
	if err := hB.Err(); err != nil {
		t.Errorf("the other holder, not cut off, lost its permit: %v", err)
	}
	if err := hA.Release(ctx); !errors.Is(err, locker.ErrLost) {
		t.Errorf("the cut holder's Release: %v, want ErrLost", err)
	}
	for _, h := range []locker.Handle{hB, r.h} {
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// mustNotTry checks that every permit of k's semaphore of n is taken.
func mustNotTry(t *testing.T, ctx context.Context, l *zookeeper.Locker, k string, n int) {
	t.Helper()
	h, err := l.TryAcquireSemaphore(ctx, k, n)
	if err == nil {
		_ = h.Release(ctx)
		t.Fatal("TryAcquireSemaphore of a full semaphore succeeded")
	}
	if !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquireSemaphore of a full semaphore: %v, want ErrNotAcquired", err)
	}
}

// Nodes of a semaphore deleted on the server (an operator): a holder's
// deletion is its loss, reported promptly, and its permit goes to the first
// waiter; a waiter's deletion in the middle of the queue wakes the waiter
// behind it, which moves up, while the deleted one queues again at the
// back when it notices.
func TestPermitNodesDeleted(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	admin := adminConn(t, srv.Addr())
	a, b, c, d := newClient(t, srv.Addr()), newClient(t, srv.Addr()), newClient(t, srv.Addr()), newClient(t, srv.Addr())
	ctx := ctxFor(t, time.Minute)
	k := testKey(t)
	dir := zookeeper.SemaphoreDir("", k)
	hA, err := a.l.TryAcquireSemaphore(ctx, k, 1)
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan acquired, 3)
	goAcquire(res, 1, func() (locker.Handle, error) { return b.l.AcquireSemaphore(ctx, k, 1) })
	waitDir(t, admin, dir, 10*time.Second, "b queued", func(kids []string) bool { return len(kids) == 2 })
	goAcquire(res, 2, func() (locker.Handle, error) { return c.l.AcquireSemaphore(ctx, k, 1) })
	kids := waitDir(t, admin, dir, 10*time.Second, "c queued", func(kids []string) bool { return len(kids) == 3 })
	slices.SortFunc(kids, compareSeq)
	time.Sleep(200 * time.Millisecond) // c watches b's node (the verdict does not depend on it)
	// b's node goes from under it: c moves up to first waiter.
	if err := admin.Delete(dir+"/"+kids[1], -1); err != nil {
		t.Fatal(err)
	}
	goAcquire(res, 3, func() (locker.Handle, error) { return d.l.AcquireSemaphore(ctx, k, 1) })
	waitDir(t, admin, dir, 10*time.Second, "d queued", func(kids []string) bool { return len(kids) == 3 })
	// a's node goes from under it: its loss, and the permit is c's.
	deleted := time.Now()
	if err := admin.Delete(hA.(*zookeeper.Handle).Node(), -1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hA.Done():
		t.Logf("the holder reported the deletion of its node after %v: %v", time.Since(deleted).Round(time.Millisecond), hA.Err())
	case <-time.After(2 * time.Second):
		t.Fatal("the holder whose node was deleted did not report the loss within 2s")
	}
	r := <-res
	if r.err != nil || r.i != 2 {
		t.Fatalf("after the holder's node went: client %d got %v, %v; want c (2), first in line once b's node went", r.i, r.h, r.err)
	}
	if got := path.Base(r.h.(*zookeeper.Handle).Node()); got != kids[2] {
		t.Errorf("c holds with node %s, want its own %s", got, kids[2])
	}
	// b noticed its node was gone when a's went (it watched a's), and
	// queued again: behind d.
	if err := r.h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next := <-res
	if next.err != nil || next.i != 3 {
		t.Fatalf("after c: client %d got %v, %v; want d (3), queued before b queued again", next.i, next.h, next.err)
	}
	if err := next.h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	last := <-res
	if last.err != nil || last.i != 1 {
		t.Fatalf("last: client %d got %v, %v; want b (1)", last.i, last.h, last.err)
	}
	if got := path.Base(last.h.(*zookeeper.Handle).Node()); got == kids[1] {
		t.Errorf("b holds with its deleted node %s", got)
	}
	if err := last.h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := hA.Release(ctx); !errors.Is(err, locker.ErrLost) {
		t.Errorf("Release of the permit whose node was deleted: %v, want ErrLost", err)
	}
}

// The limit is checked against the waiters as well as the holders: an
// acquisition of another n fails at once, waiting or not, and leaves no
// node behind; the queue of the first limit goes on undisturbed.
func TestSemaphoreLimitAgainstQueue(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	admin := adminConn(t, srv.Addr())
	a, b, c := newClient(t, srv.Addr()), newClient(t, srv.Addr()), newClient(t, srv.Addr())
	ctx := ctxFor(t, time.Minute)
	k := testKey(t)
	dir := zookeeper.SemaphoreDir("", k)
	var held []locker.Handle
	for range 2 {
		h, err := a.l.TryAcquireSemaphore(ctx, k, 2)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, h)
	}
	res := make(chan acquired, 1)
	goAcquire(res, 0, func() (locker.Handle, error) { return b.l.AcquireSemaphore(ctx, k, 2) })
	waitDir(t, admin, dir, 10*time.Second, "b queued", func(kids []string) bool { return len(kids) == 3 })
	for _, n := range []int{1, 3} {
		start := time.Now()
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		h, err := c.l.AcquireSemaphore(wctx, k, n)
		cancel()
		if !errors.Is(err, locker.ErrLimitMismatch) {
			if err == nil {
				_ = h.Release(ctx)
			}
			t.Fatalf("AcquireSemaphore of %d on a semaphore of 2 with a waiter: %v, want ErrLimitMismatch", n, err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("the mismatch took %v to be reported, want at once", took)
		}
		if _, err := c.l.TryAcquireSemaphore(ctx, k, n); !errors.Is(err, locker.ErrLimitMismatch) {
			t.Fatalf("TryAcquireSemaphore of %d on a semaphore of 2 with a waiter: %v, want ErrLimitMismatch", n, err)
		}
	}
	if kids := waitDir(t, admin, dir, 5*time.Second, "the refused nodes deleted", func(kids []string) bool { return len(kids) == 3 }); len(kids) != 3 {
		t.Fatalf("nodes %v", kids)
	}
	if err := held[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil {
		t.Fatalf("b, the waiter of the first limit: %v", r.err)
	}
	for _, h := range []locker.Handle{held[0], r.h} {
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A free key takes any limit.
	h, err := c.l.TryAcquireSemaphore(ctx, k, 3)
	if err != nil {
		t.Fatalf("a semaphore of 3 once the key is free: %v", err)
	}
	_ = h.Release(ctx)
}

// Reader-writer locks wake only whom a change concerns: a writer holds,
// readers r1 and r2 wait behind it, then a writer w2, then readers r3 and
// r4. The writer's release lets r1 and r2 in together (they watch it) and
// nobody else hears of it; r1 leaving wakes nobody (w2 watches r2, its
// predecessor); r2 leaving lets w2 in; w2 leaving lets r3 and r4 in
// together. Tokens: each writer above everything before it, each reader
// above the writers before it.
func TestReadWriteWakesOnlyItsTurn(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	admin := adminConn(t, srv.Addr())
	ctx := ctxFor(t, time.Minute)
	k := testKey(t)
	dir := zookeeper.ReadWriteDir("", k)
	const w1, r1, r2, w2, r3, r4 = 0, 1, 2, 3, 4, 5
	names := []string{"w1", "r1", "r2", "w2", "r3", "r4"}
	cs := make([]*counted, len(names))
	for i := range cs {
		cs[i] = newCounted(t, srv.Addr())
	}
	hW1, err := cs[w1].l.AcquireWrite(ctx, k) // not Try: see TestSemaphoreNoHerd
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan acquired, len(cs))
	for i := r1; i <= r4; i++ {
		acquire := cs[i].l.AcquireRead
		if i == w2 {
			acquire = cs[i].l.AcquireWrite
		}
		goAcquire(res, i, func() (locker.Handle, error) { return acquire(ctx, k) })
		waitDir(t, admin, dir, 10*time.Second, names[i]+" queued", func(kids []string) bool { return len(kids) == i+1 })
	}
	// Each waiter watches the one node it waits for (r1 and r2 their own
	// too: one writer is all they wait for).
	until(t, "the waiters never all watched", func() bool {
		for i := r1; i <= r4; i++ {
			if !cs[i].settled(1) {
				return false
			}
		}
		return true
	})
	snapshot := func() []int64 {
		ev := make([]int64, len(cs))
		for i, c := range cs {
			ev[i] = c.events.Load()
		}
		return ev
	}
	quiet := func(step string, before []int64, who ...int) {
		t.Helper()
		for _, i := range who {
			if d := cs[i].events.Load() - before[i]; d != 0 {
				t.Errorf("%s: %s, waiting, had %d watch events; want none", step, names[i], d)
			}
		}
	}
	got := func(step string, want ...int) map[int]locker.Handle {
		t.Helper()
		hs := map[int]locker.Handle{}
		for range want {
			select {
			case r := <-res:
				if r.err != nil || !slices.Contains(want, r.i) {
					t.Fatalf("%s: %s got %v, %v; want %v", step, names[r.i], r.h, r.err, want)
				}
				hs[r.i] = r.h
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: only %d of %v got the lock", step, len(hs), want)
			}
		}
		select {
		case r := <-res:
			t.Fatalf("%s: %s got the lock too (%v)", step, names[r.i], r.err)
		case <-time.After(200 * time.Millisecond):
		}
		return hs
	}
	before := snapshot()
	if err := hW1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	readers := got("w1 released", r1, r2)
	quiet("w1 released", before, w2, r3, r4)
	for _, i := range []int{r1, r2} {
		if readers[i].Token() <= hW1.Token() {
			t.Errorf("%s's token %d not above w1's %d", names[i], readers[i].Token(), hW1.Token())
		}
	}
	before = snapshot()
	if err := readers[r1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	got("r1 released")
	quiet("r1 released", before, w2, r3, r4)
	if err := readers[r2].Release(ctx); err != nil {
		t.Fatal(err)
	}
	hW2 := got("r2 released", w2)[w2]
	quiet("r2 released", before, r3, r4)
	if hW2.Token() <= readers[r1].Token() || hW2.Token() <= readers[r2].Token() {
		t.Errorf("w2's token %d not above the readers' %d and %d", hW2.Token(), readers[r1].Token(), readers[r2].Token())
	}
	if err := hW2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	last := got("w2 released", r3, r4)
	for _, h := range last {
		if h.Token() <= hW2.Token() {
			t.Errorf("a reader's token %d not above w2's %d", h.Token(), hW2.Token())
		}
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Semaphores under ACLs: with a digest ACL for the creator, the relay (a
// permit's write to its node) works and the queue moves; an ACL that grants
// nobody WRITE is refused up front, naming WithACL, rather than taking
// permits that could not wake the waiters after them.
func TestSemaphoreACL(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	root := "/locker-semacl-" + time.Now().Format("150405.000")
	auth := []zookeeper.Option{
		zookeeper.WithPrefix(root),
		zookeeper.WithAuth("digest", []byte("alice:wonderland")),
		zookeeper.WithACL(zk.AuthACL(zk.PermAll)...),
	}
	a, b, c := newClient(t, srv.Addr(), auth...), newClient(t, srv.Addr(), auth...), newClient(t, srv.Addr(), auth...)
	ctx := ctxFor(t, time.Minute)
	k := testKey(t)
	hA, err := a.l.TryAcquireSemaphore(ctx, k, 1)
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan acquired, 2)
	goAcquire(res, 1, func() (locker.Handle, error) { return b.l.AcquireSemaphore(ctx, k, 1) })
	admin := adminConn(t, srv.Addr())
	if err := admin.AddAuth("digest", []byte("alice:wonderland")); err != nil {
		t.Fatal(err)
	}
	dir := zookeeper.SemaphoreDir(root, k)
	waitDir(t, admin, dir, 10*time.Second, "b queued", func(kids []string) bool { return len(kids) == 2 })
	goAcquire(res, 2, func() (locker.Handle, error) { return c.l.AcquireSemaphore(ctx, k, 1) })
	waitDir(t, admin, dir, 10*time.Second, "c queued", func(kids []string) bool { return len(kids) == 3 })
	for i, h := range []locker.Handle{hA, nil} {
		if h == nil {
			h = (<-res).h
		}
		if err := h.Release(ctx); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
	select {
	case r := <-res:
		if r.err != nil || r.i != 2 {
			t.Fatalf("c: %v %v", r.i, r.err)
		}
		if err := r.h.Err(); err != nil {
			t.Errorf("c's permit under a digest ACL: %v", err)
		}
		_ = r.h.Release(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("c never got the permit: the relay did not wake it under a digest ACL")
	}

	noWrite := newClient(t, srv.Addr(), zookeeper.WithPrefix(root+"-nowrite"),
		zookeeper.WithAuth("digest", []byte("alice:wonderland")),
		zookeeper.WithACL(zk.AuthACL(zk.PermCreate|zk.PermRead|zk.PermDelete|zk.PermAdmin)...))
	if h, err := noWrite.l.TryAcquireSemaphore(ctx, k, 2); !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), "WithACL") {
		if err == nil {
			_ = h.Release(ctx)
		}
		t.Errorf("a semaphore under an ACL without WRITE: %v, want an error wrapping ErrInvalidOption naming WithACL", err)
	}
	// Its reader-writer locks need no write.
	h, err := noWrite.l.TryAcquireWrite(ctx, k)
	if err != nil {
		t.Fatalf("a write lock under an ACL without WRITE: %v", err)
	}
	_ = h.Release(ctx)
}

// Every valid key works in every family, the longest and the oddest too,
// and each family's lock of a key is apart from the others'.
func TestFamilyKeys(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	a, b := newClient(t, srv.Addr()), newClient(t, srv.Addr())
	ctx := ctxFor(t, time.Minute)
	base := testKey(t)
	keys := []string{
		base + "/..", base + "/zookeeper", base + "/%2F", base + "/ {}*'\"\t",
		base + "/" + strings.Repeat("🔒", (locker.MaxKeyLen-len(base)-1)/4),
		base + "/\u0085\uffff",
	}
	for _, k := range keys {
		if err := locker.ValidateKey(k); err != nil {
			t.Fatalf("test bug: %q: %v", truncated(k), err)
		}
		var held []locker.Handle
		take := func(what string, f func(context.Context, string, ...locker.Option) (locker.Handle, error)) {
			t.Helper()
			h, err := f(ctx, k)
			if err != nil {
				t.Fatalf("%s of %q: %v", what, truncated(k), err)
			}
			if h.Key() != k {
				t.Errorf("%s: Key() = %q, want %q", what, truncated(h.Key()), truncated(k))
			}
			held = append(held, h)
		}
		take("mutex", a.l.TryAcquire)
		take("read", a.l.TryAcquireRead)
		take("read", b.l.TryAcquireRead)
		take("permit", func(ctx context.Context, k string, o ...locker.Option) (locker.Handle, error) {
			return a.l.TryAcquireSemaphore(ctx, k, 2, o...)
		})
		take("permit", func(ctx context.Context, k string, o ...locker.Option) (locker.Handle, error) {
			return b.l.TryAcquireSemaphore(ctx, k, 2, o...)
		})
		if _, err := b.l.TryAcquireWrite(ctx, k); !errors.Is(err, locker.ErrNotAcquired) {
			t.Errorf("write while readers hold %q: %v, want ErrNotAcquired", truncated(k), err)
		}
		if _, err := b.l.TryAcquireSemaphore(ctx, k, 2); !errors.Is(err, locker.ErrNotAcquired) {
			t.Errorf("a third permit of 2 on %q: %v, want ErrNotAcquired", truncated(k), err)
		}
		for _, h := range held {
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func truncated(k string) string {
	if len(k) <= 80 {
		return k
	}
	return k[:40] + "…" + k[len(k)-20:]
}
