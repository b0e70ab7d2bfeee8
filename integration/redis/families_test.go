package redis_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis"
)

// The lock families (semaphores, reader-writer locks) on a real server,
// beyond the conformance cases: the wake-ups a release sends (one per
// admitted waiter, none to the others), FIFO order, what a cancelled wait
// and a release leave on the server, and the faults where the algorithm has
// a window: a cut holder, a waiter whose process dies, a holder whose record
// the server loses.

// famName is the name of one of key's names in a family ("sem" or "rw"),
// as the package documentation lays them out: the mutex's hash tag, then
// ":sem:" or ":rw:" and the name's own suffix.
func famName(l *redis.Locker, fam, key, suffix string) string {
	lock, _, _ := l.KeyNames(key)
	return strings.TrimSuffix(lock, ":lock") + ":" + fam + ":" + suffix
}

// famWake is the wake-up channel of l for key in a family.
func famWake(l *redis.Locker, fam, key string) string {
	_, _, wake := l.KeyNames(key)
	i := strings.LastIndex(wake, ":wake:")
	return wake[:i] + ":" + fam + wake[i:]
}

func semAcquire(n int) func(l *redis.Locker) func(context.Context, string, ...locker.Option) (locker.Handle, error) {
	return func(l *redis.Locker) func(context.Context, string, ...locker.Option) (locker.Handle, error) {
		return locker.Semaphore(l, n).Acquire
	}
}

// must returns a function that fails t on an acquisition's error and
// returns its Handle.
func must(t testing.TB) func(h locker.Handle, err error) *redis.Handle {
	return func(h locker.Handle, err error) *redis.Handle {
		t.Helper()
		if err != nil {
			t.Fatalf("acquire: %v", err)
		}
		return h.(*redis.Handle)
	}
}

// settledWaiter starts an Acquire on a Locker of its own (a process of its
// own) whose client counts script calls, and waits until it is queued (the
// queue holds want entries), subscribed and has made its attempt after
// subscribing: it then sends nothing more until it is told its turn came.
func settledWaiter(t *testing.T, ctx context.Context, addr string, admin *goredis.Client, i int, fam, key string, want int64,
	acquire func(l *redis.Locker) func(context.Context, string, ...locker.Option) (locker.Handle, error),
	got chan<- acquired, opts ...redis.Option) *scriptCounter {
	t.Helper()
	c := testClient(t, addr, true)
	sc := &scriptCounter{}
	c.AddHook(sc)
	l := redis.New(c, opts...)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		h, err := acquire(l)(ctx, key)
		got <- acquired{i, h, err, time.Now()}
	}()
	waitQueued(t, ctx, admin, famName(l, fam, key, "queue"), want)
	waitSubscribed(t, ctx, admin, famWake(l, fam, key))
	for sc.n.Load() < 2 {
		select {
		case <-ctx.Done():
			t.Fatalf("waiter %d made %d attempts, want 2 (the first and the one after subscribing)", i, sc.n.Load())
		case <-time.After(5 * time.Millisecond):
		}
	}
	return sc
}

// quiet are options under which a waiter never tries again on its own
// while a test runs: only a wake-up can make it act.
var quiet = []redis.Option{redis.WithDefaultTTL(10 * time.Minute), redis.WithRetryInterval(10 * time.Minute)}

// TestSemaphoreReleaseWakesOne: waiters of a full semaphore, each on a
// Locker of its own, get permits in the order they came; each release
// publishes one wake-up, to the waiter whose turn it is, and only that
// waiter sends anything (two script calls per handoff, however many wait).
// The waiters never try on their own (a TTL and retry interval beyond the
// test), so the handoffs are the notifications' doing, not polling.
func TestSemaphoreReleaseWakesOne(t *testing.T) {
	srv := testserver.NewRedis(t)
	ctx := testCtx(t)
	admin := testClient(t, srv.Addr(), true)
	key := uniqueKey(t)
	const n, waiters = 2, 8
	holder := newTestLocker(t, srv.Addr(), quiet...)
	sem := locker.Semaphore(holder, n)
	// Load the scripts (a first call on a fresh server is EVALSHA + EVAL).
	mustRelease(t, ctx, must(t)(sem.Acquire(ctx, key+"/warm-up")))
	held := []locker.Handle{must(t)(sem.TryAcquire(ctx, key)), must(t)(sem.TryAcquire(ctx, key))}
	top := held[1].Token()

	got := make(chan acquired, waiters)
	counters := make([]*scriptCounter, waiters)
	for i := range waiters {
		counters[i] = settledWaiter(t, ctx, srv.Addr(), admin, i, "sem", key, int64(i+1), semAcquire(n), got, quiet...)
	}
	if _, err := sem.TryAcquire(ctx, key); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a full semaphore: %v, want ErrNotAcquired", err)
	}
	before := readCommandStats(t, ctx, admin)
	settled := make([]int64, waiters)
	for i, c := range counters {
		settled[i] = c.n.Load()
	}

	const rounds = 6
	for round := range rounds {
		// The oldest permit goes back: the holder's first, then the waiters'.
		mustRelease(t, ctx, held[0])
		held = held[1:]
		r := <-got
		if r.err != nil {
			t.Fatalf("round %d: %v", round, r.err)
		}
		if r.i != round {
			t.Errorf("round %d: waiter %d got the permit, want waiter %d (FIFO)", round, r.i, round)
		}
		if r.h.Token() <= top {
			t.Errorf("round %d: token %d not above %d", round, r.h.Token(), top)
		}
		top = r.h.Token()
		held = append(held, r.h)
	}
	select {
	case r := <-got:
		t.Fatalf("waiter %d returned (%v) after %d releases; only %d should have", r.i, r.err, rounds, rounds)
	default:
	}
	d := readCommandStats(t, ctx, admin).sub(before)
	t.Logf("over %d handoffs with %d waiters: %v", rounds, waiters, d)
	if p := d.published(); p != rounds {
		t.Errorf("%d wake-ups published for %d releases, want one each", p, rounds)
	}
	if s := d["evalsha"] + d["eval"]; s != 2*rounds {
		t.Errorf("%d script calls for %d handoffs, want %d (a release and an attempt each)", s, rounds, 2*rounds)
	}
	for i, c := range counters {
		var want int64
		switch {
		case i < rounds-n:
			want = 2 // its attempt when its turn came, and its release
		case i < rounds:
			want = 1 // it still holds its permit
		}
		if got := c.n.Load() - settled[i]; got != want {
			t.Errorf("waiter %d made %d script calls during the handoffs, want %d", i, got, want)
		}
	}
	for _, h := range held {
		mustRelease(t, ctx, h)
	}
}

// TestRWReleaseWakesReadersTogether: behind a writer, the readers queued
// before the next waiting writer are woken by its release, all together
// (the others get in while the first is stalled) and nobody else; the readers' releases wake nobody until the last, which
// wakes the writer; the writer's release wakes the readers behind it. Every
// token is above every token granted before it. Only notifications wake the
// waiters (quiet).
func TestRWReleaseWakesReadersTogether(t *testing.T) {
	srv := testserver.NewRedis(t)
	ctx := testCtx(t)
	admin := testClient(t, srv.Addr(), true)
	key := uniqueKey(t)
	holder := newTestLocker(t, srv.Addr(), quiet...)
	mustRelease(t, ctx, must(t)(holder.AcquireWrite(ctx, key+"/warm-up")))
	w0 := must(t)(holder.TryAcquireWrite(ctx, key))

	read := func(l *redis.Locker) func(context.Context, string, ...locker.Option) (locker.Handle, error) {
		return l.AcquireRead
	}
	write := func(l *redis.Locker) func(context.Context, string, ...locker.Option) (locker.Handle, error) {
		return l.AcquireWrite
	}
	// Queued in this order: readers 0-2, writer 3, readers 4-5.
	// Reader 0 reaches the server through a proxy, to be stalled.
	kinds := []string{"r", "r", "r", "w", "r", "r"}
	px := testserver.NewProxy(t, srv.Addr())
	got := make(chan acquired, len(kinds))
	for i, k := range kinds {
		f := read
		if k == "w" {
			f = write
		}
		addr := srv.Addr()
		if i == 0 {
			addr = px.Addr()
		}
		settledWaiter(t, ctx, addr, admin, i, "rw", key, int64(i+1), f, got, quiet...)
	}
	receive := func(want ...int) map[int]locker.Handle {
		t.Helper()
		hs := map[int]locker.Handle{}
		for range want {
			select {
			case r := <-got:
				if r.err != nil {
					t.Fatalf("waiter %d: %v", r.i, r.err)
				}
				hs[r.i] = r.h
			case <-time.After(2 * time.Second):
				t.Fatalf("waiters %v should hold the key; got %v", want, slices.Collect(mapKeys(hs)))
			}
		}
		for _, i := range want {
			if hs[i] == nil {
				t.Fatalf("waiters %v should have the key; got %v", want, slices.Collect(mapKeys(hs)))
			}
		}
		return hs
	}
	published := func(what string, want int64, step func()) {
		t.Helper()
		before := readCommandStats(t, ctx, admin)
		step()
		if p := readCommandStats(t, ctx, admin).sub(before).published(); p != want {
			t.Errorf("%s published %d wake-ups, want %d", what, p, want)
		}
	}

	// The release tells all three readers, not the first, which would
	// tell the next once in: with the first reader stalled, the other two
	// get in all the same.
	var readers map[int]locker.Handle
	published("the first writer's release", 3, func() {
		px.Partition(t)
		mustRelease(t, ctx, w0)
		readers = receive(1, 2)
		px.Heal(t)
		readers[0] = receive(0)[0]
	})
	for _, h := range readers {
		if h.Token() <= w0.Token() {
			t.Errorf("reader token %d not above the writer's %d", h.Token(), w0.Token())
		}
	}
	if _, err := holder.TryAcquireRead(ctx, key); !errors.Is(err, locker.ErrNotAcquired) {
		t.Errorf("TryAcquireRead while a writer waits: %v, want ErrNotAcquired", err)
	}
	published("the first two readers' releases", 0, func() {
		mustRelease(t, ctx, readers[0])
		mustRelease(t, ctx, readers[1])
	})
	var writer locker.Handle
	published("the last reader's release", 1, func() {
		mustRelease(t, ctx, readers[2])
		writer = receive(3)[3]
	})
	for _, h := range readers {
		if writer.Token() <= h.Token() {
			t.Errorf("writer token %d not above a reader's %d", writer.Token(), h.Token())
		}
	}
	published("the second writer's release", 2, func() {
		mustRelease(t, ctx, writer)
		for _, h := range receive(4, 5) {
			if h.Token() <= writer.Token() {
				t.Errorf("reader token %d not above the writer's %d", h.Token(), writer.Token())
			}
			mustRelease(t, ctx, h)
		}
	})
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// familyCase is one family under test: how to hold the key so that the
// next Acquire waits, and that Acquire.
type familyCase struct {
	name, fam string
	hold      func(l *redis.Locker, ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error)
	wait      func(l *redis.Locker, ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error)
}

var familyCases = []familyCase{
	{"Semaphore", "sem",
		func(l *redis.Locker, ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
			return l.TryAcquireSemaphore(ctx, key, 1, opts...)
		},
		func(l *redis.Locker, ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
			return l.AcquireSemaphore(ctx, key, 1, opts...)
		}},
	{"Write", "rw", (*redis.Locker).TryAcquireWrite, (*redis.Locker).AcquireRead},
	{"Read", "rw", (*redis.Locker).TryAcquireRead, (*redis.Locker).AcquireWrite},
}

// famLeftovers lists the names of key in a family that exist on the
// server, the fence counter and the release record aside (the counter
// lives on; the record expires on its own a few seconds after the release).
func famLeftovers(t *testing.T, ctx context.Context, admin *goredis.Client, l *redis.Locker, fam, key string) []string {
	t.Helper()
	var left []string
	for _, s := range []string{"holders", "leases", "limit", "queue", "waiters"} {
		name := famName(l, fam, key, s)
		if n, err := admin.Exists(ctx, name).Result(); err != nil || n != 0 {
			left = append(left, name)
		}
	}
	return left
}

// TestFamilyCancelledWaitLeavesNothing: a waiter whose context ends leaves
// the queue at once (its entry would live minutes: only the leave can take
// it out), and once the holder has released, nothing of the key is left on
// the server but its fence counter and release record.
func TestFamilyCancelledWaitLeavesNothing(t *testing.T) {
	srv := testserver.Redis(t)
	admin := testClient(t, srv.Addr(), true)
	for _, fc := range familyCases {
		t.Run(fc.name, func(t *testing.T) {
			ctx := testCtx(t)
			key := uniqueKey(t)
			holder := newTestLocker(t, srv.Addr(), quiet...)
			waiter := newTestLocker(t, srv.Addr(), quiet...)
			h := must(t)(fc.hold(holder, ctx, key))
			wctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				wh, err := fc.wait(waiter, wctx, key)
				if err == nil {
					_ = wh.Release(ctx)
				}
				done <- err
			}()
			queue := famName(waiter, fc.fam, key, "queue")
			waitQueued(t, ctx, admin, queue, 1)
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled wait: %v, want context.Canceled", err)
			}
			lctx, lcancel := context.WithTimeout(ctx, 2*time.Second)
			defer lcancel()
			waitQueued(t, lctx, admin, queue, 0)
			mustRelease(t, ctx, h)
			if left := famLeftovers(t, ctx, admin, holder, fc.fam, key); len(left) > 0 {
				t.Errorf("after the release the server still has %v", left)
			}
			if n := admin.Exists(ctx, famName(holder, fc.fam, key, "fence")).Val(); n != 1 {
				t.Error("the fence counter is gone")
			}
		})
	}
}

// TestFamilyCutHolderLosesFirst: a holder cut off from Redis hears of the
// loss before a client waiting for its permit, or for its read or write
// lock, gets the key.
func TestFamilyCutHolderLosesFirst(t *testing.T) {
	srv := testserver.Redis(t)
	admin := testClient(t, srv.Addr(), true)
	for _, fc := range familyCases {
		t.Run(fc.name, func(t *testing.T) {
			ctx := testCtx(t)
			px := testserver.NewProxy(t, srv.Addr())
			const ttl = time.Second
			holder := newTestLocker(t, px.Addr(), redis.WithDefaultTTL(ttl))
			other := newTestLocker(t, srv.Addr())
			key := uniqueKey(t)
			h := must(t)(fc.hold(holder, ctx, key))
			got := make(chan acquired, 1)
			go func() {
				oh, err := fc.wait(other, ctx, key)
				got <- acquired{0, oh, err, time.Now()}
			}()
			waitSubscribed(t, ctx, admin, famWake(other, fc.fam, key))
			px.Blackhole(t)
			cut := time.Now()
			<-h.Done()
			lost := time.Now()
			r := <-got
			if r.err != nil {
				t.Fatalf("the waiter: %v", r.err)
			}
			t.Logf("cut → loss reported %v, cut → other holds %v", lost.Sub(cut), r.at.Sub(cut))
			if !errors.Is(h.Err(), locker.ErrLost) {
				t.Errorf("Err() = %v, want ErrLost", h.Err())
			}
			if !lost.Before(r.at) {
				t.Errorf("the other client got the key %v before the cut-off holder heard of the loss", lost.Sub(r.at))
			}
			if r.h.Token() <= h.Token() {
				t.Errorf("the next holder's token %d is not above the lost holder's %d", r.h.Token(), h.Token())
			}
			px.Heal(t)
			if err := h.Release(ctx); !errors.Is(err, locker.ErrLost) {
				t.Errorf("Release after the loss: %v, want ErrLost", err)
			}
			if err := r.h.Err(); err != nil {
				t.Errorf("the lost holder's Release touched the next holder: %v", err)
			}
			mustRelease(t, ctx, r.h)
		})
	}
}

// TestSemaphoreLimitFreedByExpiry: the limit of a semaphore lives only as
// long as its holders and waiters: once the permits of crashed holders have
// run out, another n is accepted (not refused by a stale limit).
func TestSemaphoreLimitFreedByExpiry(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	px := testserver.NewProxy(t, srv.Addr())
	dying := newTestLocker(t, px.Addr())
	other := newTestLocker(t, srv.Addr())
	key := uniqueKey(t)
	const ttl = time.Second
	must(t)(dying.TryAcquireSemaphore(ctx, key, 2, locker.WithTTL(ttl)))
	must(t)(dying.TryAcquireSemaphore(ctx, key, 2, locker.WithTTL(ttl)))
	if _, err := other.TryAcquireSemaphore(ctx, key, 3); !errors.Is(err, locker.ErrLimitMismatch) {
		t.Fatalf("TryAcquireSemaphore with another n while held: %v, want ErrLimitMismatch", err)
	}
	px.Crash(t)
	crashed := time.Now()
	for {
		h, err := other.TryAcquireSemaphore(ctx, key, 3)
		if err == nil {
			t.Logf("a semaphore of 3 taken %v after the holders of a semaphore of 2 crashed (TTL %v)", time.Since(crashed), ttl)
			mustRelease(t, ctx, h)
			break
		}
		if !errors.Is(err, locker.ErrLimitMismatch) || time.Since(crashed) > ttl+time.Second {
			t.Fatalf("TryAcquireSemaphore(3) %v after the holders crashed: %v", time.Since(crashed), err)
		}
		time.Sleep(20 * time.Millisecond) // polling the test's own condition: nothing to wait on
	}
}

// TestFamilyKilledWaiter: a waiter whose process dies (its connection
// gone, no leave) holds the key up only until its queue entry lapses: a
// dead waiter at the head of a semaphore's queue, given the permit by a
// release, passes it to the next waiter within the entry's lease and the
// next waiter's recheck; a dead writer queued between a reader holding
// the key and a reader behind it lets that reader in as soon as its entry
// lapses, while the first reader still holds the key.
func TestFamilyKilledWaiter(t *testing.T) {
	srv := testserver.Redis(t)
	admin := testClient(t, srv.Addr(), true)
	const ttl = time.Second
	lease := queueLeaseOf(ttl)
	bound := lease + lease/3
	const slack = time.Second
	type setup struct {
		name, fam string
		hold      func(l *redis.Locker, ctx context.Context, key string) (locker.Handle, error)
		dead      func(l *redis.Locker, ctx context.Context, key string) (locker.Handle, error)
		next      func(l *redis.Locker, ctx context.Context, key string) (locker.Handle, error)
		release   bool // release the holder after the kill
	}
	for _, s := range []setup{
		{"SemaphoreHeadAtRelease", "sem",
			func(l *redis.Locker, ctx context.Context, key string) (locker.Handle, error) {
				return l.TryAcquireSemaphore(ctx, key, 1, locker.WithTTL(time.Minute))
			},
			func(l *redis.Locker, ctx context.Context, key string) (locker.Handle, error) {
				return l.AcquireSemaphore(ctx, key, 1)
			},
			func(l *redis.Locker, ctx context.Context, key string) (locker.Handle, error) {
				return l.AcquireSemaphore(ctx, key, 1)
			}, true},
		{"WriterBetweenReaders", "rw",
			func(l *redis.Locker, ctx context.Context, key string) (locker.Handle, error) {
				return l.TryAcquireRead(ctx, key, locker.WithTTL(time.Minute))
			},
			func(l *redis.Locker, ctx context.Context, key string) (locker.Handle, error) {
				return l.AcquireWrite(ctx, key)
			},
			func(l *redis.Locker, ctx context.Context, key string) (locker.Handle, error) {
				return l.AcquireRead(ctx, key)
			}, false},
	} {
		t.Run(s.name, func(t *testing.T) {
			ctx := testCtx(t)
			holder := newTestLocker(t, srv.Addr())
			px := testserver.NewProxy(t, srv.Addr())
			dying := newTestLocker(t, px.Addr(), redis.WithDefaultTTL(ttl))
			next := newTestLocker(t, srv.Addr(), redis.WithDefaultTTL(ttl))
			key := uniqueKey(t)
			queue := famName(holder, s.fam, key, "queue")
			h := must(t)(s.hold(holder, ctx, key))
			go func() {
				if dh, err := s.dead(dying, ctx, key); err == nil {
					t.Error("the killed waiter acquired the key")
					_ = dh.Release(ctx)
				}
			}()
			waitQueued(t, ctx, admin, queue, 1)
			got := make(chan acquired, 1)
			go func() {
				nh, err := s.next(next, ctx, key)
				got <- acquired{1, nh, err, time.Now()}
			}()
			waitQueued(t, ctx, admin, queue, 2)
			px.Crash(t)
			killed := time.Now()
			if s.release {
				mustRelease(t, ctx, h)
			}
			select {
			case r := <-got:
				if r.err != nil {
					t.Fatal(r.err)
				}
				t.Logf("the next waiter held the key %v after the waiter ahead of it was killed (bound %v)", r.at.Sub(killed), bound)
				if r.at.Sub(killed) > bound+slack {
					t.Errorf("the next waiter got the key %v after the kill; want within %v (+%v slack)", r.at.Sub(killed), bound, slack)
				}
				mustRelease(t, ctx, r.h)
			case <-time.After(bound + slack + 10*time.Second):
				t.Fatal("a killed waiter stranded the one behind it")
			}
			if !s.release {
				mustRelease(t, ctx, h)
			}
			waitQueued(t, ctx, admin, queue, 0)
		})
	}
}

// TestFamilyHolderRecordRemoved: a holder whose record the server loses (an
// operator, a failover to a replica that missed it) hears of it at its
// next renewal; its Release reports the loss and touches nothing of the
// other holders'.
func TestFamilyHolderRecordRemoved(t *testing.T) {
	srv := testserver.Redis(t)
	admin := testClient(t, srv.Addr(), true)
	for _, fam := range []string{"sem", "rw"} {
		t.Run(fam, func(t *testing.T) {
			ctx := testCtx(t)
			const ttl = 1500 * time.Millisecond
			l := newTestLocker(t, srv.Addr(), redis.WithDefaultTTL(ttl))
			key := uniqueKey(t)
			take := func() *redis.Handle {
				if fam == "sem" {
					return must(t)(l.TryAcquireSemaphore(ctx, key, 2))
				}
				return must(t)(l.TryAcquireRead(ctx, key))
			}
			robbed, kept := take(), take()
			if err := admin.ZRem(ctx, famName(l, fam, key, "leases"), robbed.Owner()).Err(); err != nil {
				t.Fatal(err)
			}
			if err := admin.HDel(ctx, famName(l, fam, key, "holders"), robbed.Owner()).Err(); err != nil {
				t.Fatal(err)
			}
			removed := time.Now()
			select {
			case <-robbed.Done():
				t.Logf("loss reported %v after the record went (renewal every %v)", time.Since(removed), ttl/3)
			case <-time.After(ttl):
				t.Fatal("no loss reported within a TTL of the record's removal")
			}
			if !errors.Is(robbed.Err(), locker.ErrLost) {
				t.Errorf("Err() = %v, want ErrLost", robbed.Err())
			}
			if err := robbed.Release(ctx); !errors.Is(err, locker.ErrLost) {
				t.Errorf("Release of a removed record: %v, want ErrLost", err)
			}
			if err := kept.Err(); err != nil {
				t.Errorf("the other holder: %v", err)
			}
			if s := admin.ZScore(ctx, famName(l, fam, key, "leases"), kept.Owner()); s.Err() != nil {
				t.Errorf("the other holder's lease is gone from the server: %v", s.Err())
			}
			mustRelease(t, ctx, kept)
		})
	}
}

// TestFamilyKeys: keys that trip naive encodings (the tag's braces, the
// names' own separators and suffixes, the longest keys, two of which differ
// in their last byte) work in every family, and no two (family, key) pairs
// share a lock: one Locker holds every key in every family at once.
func TestFamilyKeys(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	l := newTestLocker(t, srv.Addr())
	other := newTestLocker(t, srv.Addr())
	base := uniqueKey(t)
	long := base + "/" + strings.Repeat("z", locker.MaxKeyLen-len(base)-2)
	uni := base + "/"
	if (locker.MaxKeyLen-len(uni))%2 == 1 {
		uni += "u"
	}
	uni += strings.Repeat("é", (locker.MaxKeyLen-len(uni))/2)
	keys := []string{
		base, base + "{tag}", base + "{", base + "}", base + "/x:lock", base + "/x}:fence",
		base + "}:sem:holders", base + ":sem:", base + ":rw:leases", base + "}:rw:", base + "/x:wake:",
		base + "ünïcödé/🔒", base + "\n\t", base + `\`, long + "1", long + "2", uni,
	}
	var held []locker.Handle
	for _, k := range keys {
		for _, take := range []func(context.Context, string, ...locker.Option) (locker.Handle, error){
			l.TryAcquire, locker.Semaphore(l, 1).TryAcquire, l.TryAcquireWrite,
		} {
			h, err := take(ctx, k)
			if err != nil {
				t.Fatalf("key %.40q…: %v", k, err)
			}
			held = append(held, h)
		}
	}
	for _, k := range keys {
		if _, err := other.TryAcquireRead(ctx, k); !errors.Is(err, locker.ErrNotAcquired) {
			t.Errorf("TryAcquireRead of %.40q… while written: %v, want ErrNotAcquired", k, err)
		}
		if _, err := other.TryAcquireSemaphore(ctx, k, 1); !errors.Is(err, locker.ErrNotAcquired) {
			t.Errorf("TryAcquireSemaphore of %.40q… while held: %v, want ErrNotAcquired", k, err)
		}
	}
	for _, h := range held {
		mustRelease(t, ctx, h)
	}
}

// TestFamilyReleaseRetriedByClient: a family release that the client sends
// again after losing the first reply reports success, and a robbed
// holder's release still reports the loss, replayed or not.
func TestFamilyReleaseRetriedByClient(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	c := testClient(t, srv.Addr(), true)
	replay := &replayReleases{}
	c.AddHook(replay)
	l := redis.New(c)
	t.Cleanup(func() { _ = l.Close() })
	key := uniqueKey(t)
	h := must(t)(l.TryAcquireSemaphore(ctx, key, 2))
	if err := h.Release(ctx); err != nil {
		t.Errorf("Release whose request the client sent twice: %v, want nil", err)
	}
	if replay.replayed.Load() == 0 {
		t.Fatal("the hook replayed no release request")
	}
	robbed := must(t)(l.TryAcquireWrite(ctx, key))
	if err := c.Del(ctx, famName(l, "rw", key, "leases"), famName(l, "rw", key, "holders")).Err(); err != nil {
		t.Fatal(err)
	}
	if err := robbed.Release(ctx); !errors.Is(err, locker.ErrLost) {
		t.Errorf("replayed Release by a robbed holder: %v, want ErrLost", err)
	}
}

// replayFamilyAcquires is a go-redis hook that sends every family acquire
// request twice and keeps the second reply, as go-redis does when the
// reply to the first was lost after the server had run it.
type replayFamilyAcquires struct{ replayed atomic.Int32 }

func (r *replayFamilyAcquires) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (r *replayFamilyAcquires) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

func (r *replayFamilyAcquires) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		var holders, fence bool
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok {
				holders = holders || strings.HasSuffix(s, ":holders")
				fence = fence || strings.HasSuffix(s, ":fence")
			}
		}
		if !holders || !fence {
			return next(ctx, cmd)
		}
		if err := next(ctx, cmd); err != nil {
			return err
		}
		r.replayed.Add(1)
		return next(ctx, cmd)
	}
}

// TestFamilyAcquireRetriedByClient: an acquisition that the client sends
// again after losing the first reply gets the grant the first attempt
// made (its token, one holder), not a second permit.
func TestFamilyAcquireRetriedByClient(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	admin := testClient(t, srv.Addr(), true)
	c := testClient(t, srv.Addr(), true)
	replay := &replayFamilyAcquires{}
	c.AddHook(replay)
	l := redis.New(c)
	t.Cleanup(func() { _ = l.Close() })
	for _, fam := range []string{"sem", "rw"} {
		key := uniqueKey(t)
		var h *redis.Handle
		if fam == "sem" {
			h = must(t)(l.TryAcquireSemaphore(ctx, key, 2))
		} else {
			h = must(t)(l.AcquireWrite(ctx, key))
		}
		if replay.replayed.Load() == 0 {
			t.Fatal("the hook replayed no acquire request")
		}
		if n := admin.HLen(ctx, famName(l, fam, key, "holders")).Val(); n != 1 {
			t.Errorf("%s: %d holders after a replayed acquisition, want 1", fam, n)
		}
		if f, _ := admin.Get(ctx, famName(l, fam, key, "fence")).Int64(); f != h.Token() {
			t.Errorf("%s: the handle's token is %d, the fence counter %d: the replay drew another", fam, h.Token(), f)
		}
		mustRelease(t, ctx, h)
	}
}
