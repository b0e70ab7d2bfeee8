package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/etcd"
	"github.com/go-locker/locker/integration/testserver"
)

// The fault tests of the lock families: the windows of their algorithms (see
// etcd's doc.go, "Lock families") that the conformance cases do not reach.

// handoff bounds how long a freed permit or lock takes to reach its waiter
// on the test server (a watch event, a read, and for a semaphore's next
// waiter a write).
const handoff = 2 * time.Second

// familyDir returns the etcd directory of key's lock of a family ("sem" or
// "rw") under the default prefix, as doc.go lays it out.
func familyDir(family, key string) string {
	return etcd.DefaultPrefix + "/%" + family + "/" + etcd.EncodeKey(key) + "/"
}

// dirKey is a key of a lock directory and the lease it is on.
type dirKey struct {
	key   string
	lease clientv3.LeaseID
}

// dirKeys lists the keys under dir, oldest first.
func dirKeys(t *testing.T, admin *clientv3.Client, dir string) []dirKey {
	t.Helper()
	resp, err := admin.Get(testCtx(t, 10*time.Second), dir, clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatalf("listing %q: %v", dir, err)
	}
	var ks []dirKey
	for _, kv := range resp.Kvs {
		ks = append(ks, dirKey{string(kv.Key), clientv3.LeaseID(kv.Lease)})
	}
	return ks
}

// waitDirKeys waits until dir has n keys.
func waitDirKeys(t *testing.T, admin *clientv3.Client, dir string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ks := dirKeys(t, admin, dir)
		if len(ks) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q has %d keys, want %d", dir, len(ks), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// awaitResult waits at most d for r.
func awaitResult(t *testing.T, r <-chan result, d time.Duration, what string) result {
	t.Helper()
	select {
	case res := <-r:
		return res
	case <-time.After(d):
		t.Fatalf("%s: no answer within %v", what, d)
		return result{}
	}
}

// notYet fails the test if r has answered.
func notYet(t *testing.T, r <-chan result, what string) {
	t.Helper()
	select {
	case res := <-r:
		if res.err == nil {
			_ = res.h.Release(context.Background())
		}
		t.Fatalf("%s answered (err %v) while it should still wait", what, res.err)
	default:
	}
}

// Permits released out of order, and no herd: with a semaphore of 2 held
// by H1 and H2 (H1 older) and six waiters W1..W6 queued in order, each on a
// client of its own, the release of H2 (the newer holder) admits W1, and
// then the release of H1 admits W2 while W1 still holds: W2, which watched
// W1, learned when W1 got its permit that it is now the first waiter. The
// waiters W4..W6 send no request at all meanwhile: each release wakes one
// waiter, not the queue.
func TestSemaphoreOutOfOrderReleaseNoHerd(t *testing.T) {
	srv := testserver.Etcd(t)
	admin := newEtcdClient(t, srv.Addr())
	ctx := testCtx(t, time.Minute)
	k := uniqueKey(t)
	dir := familyDir("sem", k)
	const n = 2
	holder := newClient(t, srv.Addr())
	h1, err := holder.l.TryAcquireSemaphore(ctx, k, n)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := holder.l.TryAcquireSemaphore(ctx, k, n)
	if err != nil {
		t.Fatal(err)
	}
	var (
		waits    []<-chan result
		counters []*rpcCounter
	)
	for i := range 6 {
		l, rc := countedLocker(t, srv.Addr())
		waits = append(waits, goAcquire(ctx, locker.Semaphore(l, n), k))
		waitDirKeys(t, admin, dir, n+i+1)
		counters = append(counters, rc)
	}
	for i, rc := range counters {
		waitRequests(t, rc, 4, fmt.Sprintf("W%d", i+1))
	}
	before := make([]int64, len(counters))
	for i, rc := range counters {
		before[i] = rc.n.Load()
	}
	for i, w := range waits {
		notYet(t, w, fmt.Sprintf("W%d", i+1))
	}

	mustReleaseH(t, ctx, h2)
	r1 := awaitResult(t, waits[0], handoff, "W1 after H2's release")
	if r1.err != nil {
		t.Fatalf("W1: %v", r1.err)
	}
	if r1.h.Token() <= h2.Token() {
		t.Errorf("W1's token %d is not above H2's %d", r1.h.Token(), h2.Token())
	}
	notYet(t, waits[1], "W2 with both permits held")
	mustReleaseH(t, ctx, h1)
	r2 := awaitResult(t, waits[1], handoff, "W2 after H1's release, W1 still holding (W2 must have become the first waiter when W1 got its permit)")
	if r2.err != nil {
		t.Fatalf("W2: %v", r2.err)
	}
	if r2.h.Token() <= r1.h.Token() {
		t.Errorf("W2's token %d is not above W1's %d", r2.h.Token(), r1.h.Token())
	}
	for i := 2; i < len(waits); i++ {
		notYet(t, waits[i], "a later waiter")
	}
	// W3 was woken by W2's permit (it is the first waiter now); W4..W6
	// never were.
	for i := 3; i < len(counters); i++ {
		if d := counters[i].n.Load() - before[i]; d != 0 {
			t.Errorf("W%d sent %d requests while two permits went to W1 and W2: a release woke more than one waiter", i+1, d)
		}
	}
	// FIFO to the end.
	mustReleaseH(t, ctx, r2.h)
	r3 := awaitResult(t, waits[2], handoff, "W3")
	if r3.err != nil {
		t.Fatalf("W3: %v", r3.err)
	}
	notYet(t, waits[3], "W4 with both permits held")
	mustReleaseH(t, ctx, r1.h)
	mustReleaseH(t, ctx, r3.h)
	for i := 3; i < len(waits); i++ {
		r := awaitResult(t, waits[i], handoff, "a later waiter")
		if r.err != nil {
			t.Fatalf("W%d: %v", i+1, r.err)
		}
		mustReleaseH(t, ctx, r.h)
	}
}

// countedLocker is a Locker on a client of its own whose requests are
// counted.
func countedLocker(t *testing.T, addr string) (*etcd.Locker, *rpcCounter) {
	c := newEtcdClient(t, addr)
	rc := new(rpcCounter)
	rc.count(c)
	l := etcd.New(c)
	t.Cleanup(func() { _ = l.Close() })
	return l, rc
}

// waitRequests waits until a waiter's client has sent n requests: n = 4
// once it has granted its lease, created its key, read its turn and
// opened its watch, after which it is silent until woken.
func waitRequests(t *testing.T, rc *rpcCounter, n int64, who string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for rc.n.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%s sent %d requests, want %d before it waits", who, rc.n.Load(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mustReleaseH(t *testing.T, ctx context.Context, h locker.Handle) {
	t.Helper()
	if err := h.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// A permit holder cut off from etcd reports its loss before the permit
// goes to the waiter, which gets it with a greater token; the other
// holder's permit is untouched.
func TestSemaphoreCutHolder(t *testing.T) {
	srv := testserver.Etcd(t)
	ctx := testCtx(t, time.Minute)
	k := uniqueKey(t)
	a, b, c := newClient(t, srv.Addr()), newClient(t, srv.Addr()), newClient(t, srv.Addr())
	const n = 2
	cutH, err := a.l.TryAcquireSemaphore(ctx, k, n, locker.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	keep, err := b.l.TryAcquireSemaphore(ctx, k, n, locker.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	waiting := goAcquire(ctx, locker.Semaphore(c.l, n), k, locker.WithTTL(ttl))
	cut := time.Now()
	a.px.Partition(t)
	defer a.px.Heal(t)
	var lostAt time.Time
	select {
	case <-cutH.Done():
		lostAt = time.Now()
	case r := <-waiting:
		t.Fatalf("the waiter got a permit (err %v) before the cut-off holder reported its loss", r.err)
	case <-time.After(3 * ttl):
		t.Fatalf("a permit holder cut off for %v did not report the loss", 3*ttl)
	}
	if !errors.Is(cutH.Err(), locker.ErrLost) {
		t.Errorf("Err of the cut-off holder = %v, want ErrLost", cutH.Err())
	}
	r := awaitResult(t, waiting, 3*ttl, "the waiter for the cut-off holder's permit")
	if r.err != nil {
		t.Fatalf("the waiter: %v", r.err)
	}
	t.Logf("cut at 0; loss reported at %v; the waiter held the permit at %v (TTL %v)", lostAt.Sub(cut), r.at.Sub(cut), ttl)
	if !lostAt.Before(r.at) {
		t.Errorf("loss reported at %v, not before the waiter got the permit at %v", lostAt.Sub(cut), r.at.Sub(cut))
	}
	if r.h.Token() <= keep.Token() || r.h.Token() <= cutH.Token() {
		t.Errorf("the waiter's token %d is not above the holders' %d and %d", r.h.Token(), cutH.Token(), keep.Token())
	}
	if keep.Err() != nil {
		t.Errorf("the other holder lost its permit: %v", keep.Err())
	}
	mustReleaseH(t, ctx, r.h)
	mustReleaseH(t, ctx, keep)
}

// A waiter whose lease lapses leaves the queue, and the waiter behind it
// moves up: a semaphore's first waiter whose lease is revoked fails its
// Acquire, and the next waiter, which watched it, becomes the first and
// gets the next freed permit at once. The reader-writer lock alike: a
// waiting writer whose lease is revoked fails, and the reader queued
// behind it (which waited for it alone) gets the key beside the reader
// that holds it.
func TestWaiterLeaseLapses(t *testing.T) {
	srv := testserver.Etcd(t)
	admin := newEtcdClient(t, srv.Addr())
	ctx := testCtx(t, time.Minute)

	t.Run("Semaphore", func(t *testing.T) {
		k := uniqueKey(t)
		dir := familyDir("sem", k)
		a, b, c := newClient(t, srv.Addr()), newClient(t, srv.Addr()), newClient(t, srv.Addr())
		h, err := a.l.TryAcquireSemaphore(ctx, k, 1)
		if err != nil {
			t.Fatal(err)
		}
		first := goAcquire(ctx, locker.Semaphore(b.l, 1), k, locker.WithTTL(ttl))
		waitDirKeys(t, admin, dir, 2)
		second := goAcquire(ctx, locker.Semaphore(c.l, 1), k)
		waitDirKeys(t, admin, dir, 3)
		if _, err := admin.Revoke(ctx, dirKeys(t, admin, dir)[1].lease); err != nil {
			t.Fatal(err)
		}
		// The waiter learns it at its next renewal (within a third of
		// its TTL); the waiter behind it, from its watch at once.
		if r := awaitResult(t, first, ttl, "the waiter whose lease was revoked"); r.err == nil {
			t.Fatal("a waiter whose lease was revoked got a permit")
		}
		notYet(t, second, "the next waiter while the permit is held")
		mustReleaseH(t, ctx, h)
		r := awaitResult(t, second, handoff, "the next waiter after the permit was released")
		if r.err != nil {
			t.Fatalf("the next waiter: %v", r.err)
		}
		mustReleaseH(t, ctx, r.h)
	})

	t.Run("RW", func(t *testing.T) {
		k := uniqueKey(t)
		dir := familyDir("rw", k)
		a, b, c := newClient(t, srv.Addr()), newClient(t, srv.Addr()), newClient(t, srv.Addr())
		rh, err := a.l.TryAcquireRead(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		writer := goAcquire(ctx, locker.WriteLock(b.l), k, locker.WithTTL(ttl))
		waitDirKeys(t, admin, dir, 2)
		reader := goAcquire(ctx, locker.ReadLock(c.l), k)
		waitDirKeys(t, admin, dir, 3)
		wk := dirKeys(t, admin, dir)[1]
		if !strings.HasPrefix(wk.key, dir+"w/") {
			t.Fatalf("the second key of %q is %q, not a writer's", dir, wk.key)
		}
		notYet(t, reader, "a reader behind a waiting writer")
		if _, err := admin.Revoke(ctx, wk.lease); err != nil {
			t.Fatal(err)
		}
		r := awaitResult(t, reader, handoff, "the reader once the writer before it was gone")
		if r.err != nil {
			t.Fatalf("the reader: %v", r.err)
		}
		if r := awaitResult(t, writer, ttl, "the writer whose lease was revoked"); r.err == nil {
			t.Fatal("a writer whose lease was revoked got the key")
		}
		if rh.Err() != nil {
			t.Errorf("the first reader lost the key: %v", rh.Err())
		}
		mustReleaseH(t, ctx, r.h)
		mustReleaseH(t, ctx, rh)
	})
}

// A holder whose key the server removes (an operator deletes it) reports
// the loss at once, its permit or lock goes to the waiter, and its
// Release, which reports the loss, touches nothing of the new holder's.
func TestFamilyHolderKeyDeleted(t *testing.T) {
	srv := testserver.Etcd(t)
	admin := newEtcdClient(t, srv.Addr())
	ctx := testCtx(t, time.Minute)
	for _, tc := range []struct {
		name         string
		holder, next func(locker.Locker) locker.Locker
	}{
		{"Semaphore", func(l locker.Locker) locker.Locker { return locker.Semaphore(l, 1) }, func(l locker.Locker) locker.Locker { return locker.Semaphore(l, 1) }},
		{"Writer", locker.WriteLock, locker.ReadLock},
		{"Reader", locker.ReadLock, locker.WriteLock},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := uniqueKey(t)
			a, b := newClient(t, srv.Addr()), newClient(t, srv.Addr())
			h, err := tc.holder(a.l).TryAcquire(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			waiting := goAcquire(ctx, tc.next(b.l), k)
			notYet(t, waiting, "the waiter while the key is held")
			deleted := time.Now()
			if _, err := admin.Delete(ctx, h.(*etcd.Handle).EtcdKey()); err != nil {
				t.Fatal(err)
			}
			select {
			case <-h.Done():
				t.Logf("loss reported %v after the deletion", time.Since(deleted))
			case <-time.After(time.Second):
				t.Fatal("the holder whose key was deleted did not report the loss within 1s")
			}
			if !errors.Is(h.Err(), locker.ErrLost) {
				t.Errorf("Err = %v, want ErrLost", h.Err())
			}
			r := awaitResult(t, waiting, handoff, "the waiter after the holder's key was deleted")
			if r.err != nil {
				t.Fatalf("the waiter: %v", r.err)
			}
			if err := h.Release(ctx); !errors.Is(err, locker.ErrLost) {
				t.Errorf("Release after the loss: %v, want ErrLost", err)
			}
			if r.h.Err() != nil {
				t.Errorf("the stale Release ended the new holder's lock: %v", r.h.Err())
			}
			mustReleaseH(t, ctx, r.h)
		})
	}
}

// Every valid key works in every family, each family apart from the
// others and from the mutex: keys with '/', '%', the names of the family
// directories themselves, and 1024 bytes.
func TestFamilyKeys(t *testing.T) {
	srv := testserver.Etcd(t)
	ctx := testCtx(t, time.Minute)
	a, b := newClient(t, srv.Addr()), newClient(t, srv.Addr())
	base := uniqueKey(t)
	keys := []string{
		base, base + "/", base + "/%", "%rw", "%sem", "%rw/" + base, "%sem/" + base + "/3", "%released/" + base,
		base + "/w/x", base + "/r", base + "%2F", "ключ/" + base,
		base + strings.Repeat("/%", (locker.MaxKeyLen-len(base))/2),
	}
	families := []struct {
		name string
		of   func(locker.Locker) locker.Locker
	}{
		{"mutex", func(l locker.Locker) locker.Locker { return l }},
		{"write", locker.WriteLock},
		{"semaphore", func(l locker.Locker) locker.Locker { return locker.Semaphore(l, 1) }},
	}
	var held []locker.Handle
	for _, k := range keys {
		if err := locker.ValidateKey(k); err != nil {
			t.Fatalf("test bug: %q: %v", k, err)
		}
		for _, f := range families {
			h, err := f.of(a.l).TryAcquire(ctx, k)
			if err != nil {
				t.Fatalf("%s TryAcquire(%.40q) with the other families and keys held: %v", f.name, k, err)
			}
			held = append(held, h)
		}
	}
	for _, k := range keys {
		for _, f := range families {
			if h, err := f.of(b.l).TryAcquire(ctx, k); !errors.Is(err, locker.ErrNotAcquired) {
				if err == nil {
					_ = h.Release(ctx)
				}
				t.Errorf("%s TryAcquire(%.40q) by another client while held: %v, want ErrNotAcquired", f.name, k, err)
			}
		}
		if h, err := locker.ReadLock(b.l).TryAcquire(ctx, k); !errors.Is(err, locker.ErrNotAcquired) {
			if err == nil {
				_ = h.Release(ctx)
			}
			t.Errorf("read TryAcquire(%.40q) while a writer holds it: %v, want ErrNotAcquired", k, err)
		}
	}
	for _, h := range held {
		mustReleaseH(t, ctx, h)
	}
}

// A semaphore's first waiter is admitted by the deletion event of an older
// key, without another read: the event stream must also tell it that its
// own key went first. Its key deleted from outside, then the holder's
// release: its Acquire fails (it never returns a permit it does not hold),
// and the permit is free for anyone.
func TestSemaphoreFirstWaiterKeyDeleted(t *testing.T) {
	srv := testserver.Etcd(t)
	admin := newEtcdClient(t, srv.Addr())
	ctx := testCtx(t, time.Minute)
	k := uniqueKey(t)
	dir := familyDir("sem", k)
	a, c := newClient(t, srv.Addr()), newClient(t, srv.Addr())
	h, err := a.l.TryAcquireSemaphore(ctx, k, 1)
	if err != nil {
		t.Fatal(err)
	}
	bl, brc := countedLocker(t, srv.Addr())
	waiting := goAcquire(ctx, locker.Semaphore(bl, 1), k)
	waitRequests(t, brc, 4, "the waiter") // its watch is open
	if _, err := admin.Delete(ctx, dirKeys(t, admin, dir)[1].key); err != nil {
		t.Fatal(err)
	}
	mustReleaseH(t, ctx, h)
	r := awaitResult(t, waiting, handoff, "the waiter whose key was deleted")
	if r.err == nil {
		t.Fatalf("the waiter whose key was deleted got a permit (token %d) it does not hold", r.h.Token())
	}
	t.Logf("the waiter whose key was deleted: %v", r.err)
	h2, err := locker.Semaphore(c.l, 1).TryAcquire(ctx, k)
	if err != nil {
		t.Fatalf("TryAcquire after both keys went: %v", err)
	}
	mustReleaseH(t, ctx, h2)
}
