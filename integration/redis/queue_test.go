package redis_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis"
)

// The waiters' queue (see "Waiting" in the redis package documentation):
// FIFO order, one wake-up per release, and entries of waiters that die or
// give up leaving the queue.

// queueName is the sorted set that holds key's waiters in arrival order:
// the lock's name with ":queue" for ":lock", as the package documentation
// lays the names out.
func queueName(l *redis.Locker, key string) string {
	lock, _, _ := l.KeyNames(key)
	return strings.TrimSuffix(lock, ":lock") + ":queue"
}

// waitQueued waits until the server's queue of key holds n entries, or
// fails t at ctx's end.
func waitQueued(t testing.TB, ctx context.Context, admin *goredis.Client, queue string, n int64) {
	t.Helper()
	for {
		got, err := admin.ZCard(ctx, queue).Result()
		if err == nil && got == n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("queue %q holds %d entries (%v), want %d", queue, got, err, n)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// queueLeaseOf is how long a waiter's queue entry lives without a refresh,
// as the package documentation states it: a third of its TTL, at least
// 150ms.
func queueLeaseOf(ttl time.Duration) time.Duration { return max(ttl/3, 150*time.Millisecond) }

type acquired struct {
	i   int
	h   locker.Handle
	err error
	at  time.Time
}

// TestQueueFIFO: waiters on Lockers of their own, queued one after the
// other, get the key in the order they came, each from the previous holder's
// release; a TryAcquire of the held key does not queue.
func TestQueueFIFO(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	admin := testClient(t, srv.Addr(), true)
	holder := newTestLocker(t, srv.Addr())
	key := uniqueKey(t)
	queue := queueName(holder, key)
	h := mustGet(t, ctx, holder, key)

	const n = 6
	got := make(chan acquired, n)
	for i := range n {
		// Each on its own Locker, as other processes would be; a retry
		// interval far beyond the test, so that only the release wakes.
		l := newTestLocker(t, srv.Addr(), redis.WithRetryInterval(time.Minute))
		go func() {
			wh, err := l.Acquire(ctx, key)
			got <- acquired{i, wh, err, time.Now()}
		}()
		waitQueued(t, ctx, admin, queue, int64(i+1)) // i+1 arrived in order
	}
	if _, err := holder.TryAcquire(ctx, key); err == nil {
		t.Fatal("TryAcquire of a held key succeeded")
	}
	if c := admin.ZCard(ctx, queue).Val(); c != n {
		t.Errorf("queue holds %d entries after a TryAcquire, want %d: TryAcquire must not queue", c, n)
	}

	prev := h.Token()
	mustRelease(t, ctx, h)
	for want := range n {
		r := <-got
		if r.err != nil {
			t.Fatalf("waiter %d: %v", r.i, r.err)
		}
		if r.i != want {
			t.Errorf("waiter %d got the key in turn %d: want FIFO order", r.i, want)
		}
		if r.h.Token() <= prev {
			t.Errorf("waiter %d: token %d not above %d", r.i, r.h.Token(), prev)
		}
		prev = r.h.Token()
		mustRelease(t, ctx, r.h)
	}
	waitQueued(t, ctx, admin, queue, 0)
}

// TestQueueCancelledWaiterLeaves: a waiter whose context ends leaves the
// queue at once, not at its entry's deadline, and a release then goes to
// the waiter behind it.
func TestQueueCancelledWaiterLeaves(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	admin := testClient(t, srv.Addr(), true)
	holder := newTestLocker(t, srv.Addr())
	// A long TTL, so that the entry's deadline (a third of it) is far
	// beyond the test: only the waiter's leaving can remove it in time.
	const ttl = 5 * time.Minute
	first := newTestLocker(t, srv.Addr(), redis.WithDefaultTTL(ttl), redis.WithRetryInterval(time.Minute))
	second := newTestLocker(t, srv.Addr(), redis.WithDefaultTTL(ttl), redis.WithRetryInterval(time.Minute))
	key := uniqueKey(t)
	queue := queueName(holder, key)
	h := mustGet(t, ctx, holder, key)

	fctx, fcancel := context.WithCancel(ctx)
	defer fcancel()
	firstGot := make(chan acquired, 1)
	go func() {
		wh, err := first.Acquire(fctx, key)
		firstGot <- acquired{0, wh, err, time.Now()}
	}()
	waitQueued(t, ctx, admin, queue, 1)
	secondGot := make(chan acquired, 1)
	go func() {
		wh, err := second.Acquire(ctx, key)
		secondGot <- acquired{1, wh, err, time.Now()}
	}()
	waitQueued(t, ctx, admin, queue, 2)

	fcancel()
	if r := <-firstGot; r.err == nil {
		_ = r.h.Release(ctx)
		t.Fatal("a cancelled waiter acquired a held key")
	}
	lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
	defer lcancel()
	waitQueued(t, lctx, admin, queue, 1) // long before the entry's deadline
	if head := admin.ZRange(ctx, queue, 0, 0).Val(); len(head) != 1 || strings.HasPrefix(head[0], idOf(t, first, key)+":") {
		t.Errorf("queue head after the first waiter left: %v; want the second waiter's entry", head)
	}

	released := time.Now()
	mustRelease(t, ctx, h)
	select {
	case r := <-secondGot:
		if r.err != nil {
			t.Fatalf("second waiter: %v", r.err)
		}
		t.Logf("second waiter held the key %v after the release", r.at.Sub(released))
		mustRelease(t, ctx, r.h)
	case <-time.After(10 * time.Second):
		t.Fatal("the second waiter did not get the key after the release: the turn went to the cancelled waiter")
	}
	waitQueued(t, ctx, admin, queue, 0)
}

// idOf returns the Locker id that l's queue entries start with: the last
// part of its wake-up channel (see Locker.KeyNames).
func idOf(t testing.TB, l *redis.Locker, key string) string {
	t.Helper()
	_, _, wake := l.KeyNames(key)
	i := strings.LastIndexByte(wake, ':')
	if i < 0 {
		t.Fatalf("wake-up channel %q has no Locker id", wake)
	}
	return wake[i+1:]
}

// TestQueueKilledWaiter: a waiter killed while queued (its process gone, no
// leave) holds up nobody for longer than the documented bound, its entry's
// lease (a third of its TTL) plus the next waiter's recheck interval: when
// it is the head at the release, the next waiter gets the key within it;
// when it is not, its entry leaves the queue within it all the same.
func TestQueueKilledWaiter(t *testing.T) {
	for _, atRelease := range []bool{true, false} {
		name := "HeadAtRelease"
		if !atRelease {
			name = "WhileHeld"
		}
		t.Run(name, func(t *testing.T) {
			srv := testserver.Redis(t)
			ctx := testCtx(t)
			admin := testClient(t, srv.Addr(), true)
			const ttl = time.Second
			lease := queueLeaseOf(ttl)
			recheck := lease / 3 // the next waiter has the same TTL
			bound := lease + recheck
			slack := time.Second // round trips and scheduling on a loaded machine
			holder := newTestLocker(t, srv.Addr())
			px := testserver.NewProxy(t, srv.Addr())
			dying := newTestLocker(t, px.Addr(), redis.WithDefaultTTL(ttl))
			next := newTestLocker(t, srv.Addr(), redis.WithDefaultTTL(ttl))
			key := uniqueKey(t)
			queue := queueName(holder, key)
			h := mustGet(t, ctx, holder, key, locker.WithTTL(time.Minute))

			go func() {
				if dh, err := dying.Acquire(ctx, key); err == nil {
					t.Error("the killed waiter acquired the key")
					_ = dh.Release(ctx)
				}
			}()
			waitQueued(t, ctx, admin, queue, 1)
			nextGot := make(chan acquired, 1)
			go func() {
				wh, err := next.Acquire(ctx, key)
				nextGot <- acquired{1, wh, err, time.Now()}
			}()
			waitQueued(t, ctx, admin, queue, 2)
			px.Crash(t)
			killed := time.Now()

			if !atRelease {
				// The holder keeps the key; the dead entry must still go.
				lctx, lcancel := context.WithTimeout(ctx, bound+slack)
				defer lcancel()
				waitQueued(t, lctx, admin, queue, 1)
				took := time.Since(killed)
				t.Logf("the killed waiter's entry left the queue %v after the kill (bound %v)", took, bound)
				if head := admin.ZRange(ctx, queue, 0, 0).Val(); len(head) != 1 || !strings.HasPrefix(head[0], idOf(t, next, key)+":") {
					t.Errorf("queue after the dead entry left: %v; want the live waiter's entry", head)
				}
				mustRelease(t, ctx, h)
				r := <-nextGot
				if r.err != nil {
					t.Fatal(r.err)
				}
				mustRelease(t, ctx, r.h)
				return
			}

			// The release gives the turn to the dead head.
			released := time.Now()
			mustRelease(t, ctx, h)
			select {
			case r := <-nextGot:
				if r.err != nil {
					t.Fatal(r.err)
				}
				took := r.at.Sub(released)
				t.Logf("the next waiter held the key %v after the release (bound %v after the kill: %v)", took, bound, r.at.Sub(killed))
				if r.at.Sub(killed) > bound+slack {
					t.Errorf("the next waiter got the key %v after the waiter ahead of it was killed; want within %v (+%v slack)", r.at.Sub(killed), bound, slack)
				}
				mustRelease(t, ctx, r.h)
			case <-time.After(bound + slack + 10*time.Second):
				t.Fatal("a killed waiter at the head of the queue stranded the next one")
			}
			waitQueued(t, ctx, admin, queue, 0)
		})
	}
}

// scriptCounter counts the script calls (EVALSHA, EVAL) a client has had
// answered.
type scriptCounter struct{ n atomic.Int64 }

func (s *scriptCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (s *scriptCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			s.n.Add(1)
		}
		return err
	}
}

func (s *scriptCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// TestOneReleaseWakesOne: with many waiters, each on a Locker of its own
// (separate processes), a release publishes one wake-up, and only the
// waiter whose turn it is sends anything: two script calls per handoff (the
// release, the new holder's attempt) however many wait. The server's
// command statistics are the witness; the server is private to the test so
// that nothing else moves them.
func TestOneReleaseWakesOne(t *testing.T) {
	srv := testserver.NewRedis(t)
	ctx := testCtx(t)
	admin := testClient(t, srv.Addr(), true)
	key := uniqueKey(t)
	// A TTL and a retry interval far beyond the test: no waiter refreshes
	// its entry or checks again on its own while the test runs, so every
	// request counted is one a release caused.
	opts := []redis.Option{redis.WithDefaultTTL(10 * time.Minute), redis.WithRetryInterval(10 * time.Minute)}
	holder := newTestLocker(t, srv.Addr(), opts...)
	// Load the scripts first: a script's first call on a fresh server is
	// an EVALSHA refused with NOSCRIPT and an EVAL, two calls.
	mustRelease(t, ctx, mustGet(t, ctx, holder, key+"/warm-up"))
	h := mustGet(t, ctx, holder, key)
	queue := queueName(holder, key)

	const n, rounds = 16, 5
	counters := make([]*scriptCounter, n)
	got := make(chan acquired, n)
	for i := range n {
		c := testClient(t, srv.Addr(), true)
		counters[i] = &scriptCounter{}
		c.AddHook(counters[i])
		l := redis.New(c, opts...)
		t.Cleanup(func() { _ = l.Close() })
		go func() {
			wh, err := l.Acquire(ctx, key)
			got <- acquired{i, wh, err, time.Now()}
		}()
		waitQueued(t, ctx, admin, queue, int64(i+1))
		// Settled: queued, subscribed, and its attempt after the
		// subscription (see "Waiting") answered. It sends nothing more
		// until it is told its turn has come.
		_, _, wake := l.KeyNames(key)
		waitSubscribed(t, ctx, admin, wake)
		for counters[i].n.Load() < 2 {
			select {
			case <-ctx.Done():
				t.Fatalf("waiter %d made %d attempts, want 2 (the first and the one after subscribing)", i, counters[i].n.Load())
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	before := readCommandStats(t, ctx, admin)
	settled := make([]int64, n)
	for i, c := range counters {
		settled[i] = c.n.Load()
	}

	for round := range rounds {
		mustRelease(t, ctx, h)
		r := <-got
		if r.err != nil {
			t.Fatalf("round %d: %v", round, r.err)
		}
		if r.i != round {
			t.Errorf("round %d: waiter %d got the key, want waiter %d (FIFO)", round, r.i, round)
		}
		h = r.h.(*redis.Handle)
	}
	// Every other waiter is still waiting: exactly rounds have returned.
	select {
	case r := <-got:
		t.Fatalf("waiter %d returned (%v) after %d releases; only %d should have", r.i, r.err, rounds, rounds)
	default:
	}
	d := readCommandStats(t, ctx, admin).sub(before)
	t.Logf("over %d handoffs with %d waiters: %v", rounds, n, d)
	if p := d.published(); p != rounds {
		t.Errorf("%d wake-ups published for %d releases, want one each", p, rounds)
	}
	if s := d["evalsha"] + d["eval"]; s != 2*rounds {
		t.Errorf("%d script calls for %d handoffs, want %d (a release and an attempt each)", s, rounds, 2*rounds)
	}
	for i, c := range counters {
		want := settled[i]
		if i < rounds {
			want += 2 // its attempt when its turn came, and its release
			if i == rounds-1 {
				want-- // it still holds the key
			}
		}
		if got := c.n.Load(); got != want {
			t.Errorf("waiter %d made %d script calls during the handoffs, want %d", i, got-settled[i], want-settled[i])
		}
	}
	mustRelease(t, ctx, h)
}
