package redlock_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis/redlock"
)

// The fencing tokens of the lock families are unique per key: two readers
// or two permits that hold at the same time, acquired at the same moment,
// each get a token of their own (the contract: a permit's token is
// strictly greater than every permit of the key granted before it, and
// the chaos suite checks that no token is given twice). Each node hands
// out distinct counter values, but a holder's candidate is the largest of
// a majority's, and two contenders granted on the same nodes in different
// orders can take the same largest value; the write-back must refuse the
// second claim of a value on a node.
//
// Many Lockers start TryAcquireRead (or TryAcquireSemaphore with room for
// all) at once, hold until every attempt has ended, and release; a few
// such rounds per key, on 3 and on 5 nodes.
func TestFamilyTokensUnique(t *testing.T) {
	const (
		lockers = 8
		perLk   = 3 // goroutines per Locker
		rounds  = 4
	)
	for _, n := range []int{3, 5} {
		for _, fam := range []string{"Read", "Semaphore"} {
			t.Run(fmt.Sprintf("Nodes%d/%s", n, fam), func(t *testing.T) {
				addrs := nodeAddrs(t, n)
				ctx := testCtx(t, 60*time.Second)
				key := uniqueKey(t)
				var ls []*redlock.Locker
				for range lockers {
					ls = append(ls, newLocker(t, addrs).l)
				}
				try := func(l *redlock.Locker) (locker.Handle, error) {
					if fam == "Read" {
						return l.TryAcquireRead(ctx, key)
					}
					return l.TryAcquireSemaphore(ctx, key, lockers*perLk)
				}
				owner := map[int64]string{} // token → who got it
				got, failed := 0, 0
				for round := range rounds {
					var (
						mu      sync.Mutex
						wg      sync.WaitGroup
						handles []locker.Handle
						start   = make(chan struct{})
					)
					for i, l := range ls {
						for j := range perLk {
							wg.Go(func() {
								<-start
								h, err := try(l)
								mu.Lock()
								defer mu.Unlock()
								if err != nil {
									failed++
									t.Logf("round %d, locker %d/%d: %v", round, i, j, err)
									return
								}
								got++
								handles = append(handles, h)
								who := fmt.Sprintf("locker %d goroutine %d in round %d", i, j, round)
								if prev, dup := owner[h.Token()]; dup {
									t.Errorf("token %d was given twice: to %s and to %s", h.Token(), prev, who)
								}
								owner[h.Token()] = who
							})
						}
					}
					close(start)
					wg.Wait() // every holder holds until all attempts ended
					for _, h := range handles {
						if err := h.Release(ctx); err != nil {
							t.Errorf("release of token %d: %v", h.Token(), err)
						}
					}
				}
				t.Logf("%d acquisitions, %d attempts failed", got, failed)
				if got < rounds*lockers*perLk/2 {
					t.Errorf("only %d of %d attempts acquired: too few to tell", got, rounds*lockers*perLk)
				}
			})
		}
	}
}

// A token that another owner claimed on the nodes is not handed out again:
// the node refuses the claim, and the acquisition claims a greater token.
// The nodes here look as they would after a holder, granted before ours,
// claimed the very value our grant will take (counters at 10, token 11
// claimed by "intruder" on every node). The claims of a key are bounded:
// a node keeps the latest 1024.
func TestFamilyTokenClaimedByAnother(t *testing.T) {
	addrs := nodeAddrs(t, 3)
	adm := admins(t, addrs)
	ctx := testCtx(t, 30*time.Second)
	l := newLocker(t, addrs).l
	for _, fam := range []string{"Read", "Semaphore"} {
		t.Run(fam, func(t *testing.T) {
			key := uniqueKey(t)
			sem, rw := l.FamilyNames(key)
			base := rw
			try := func() (locker.Handle, error) { return l.TryAcquireRead(ctx, key) }
			if fam == "Semaphore" {
				base = sem
				try = func() (locker.Handle, error) { return l.TryAcquireSemaphore(ctx, key, 2) }
			}
			claims := base + ":claims"
			for i, a := range adm {
				if err := a.Set(ctx, base+":fence", 10, 0).Err(); err != nil {
					t.Fatalf("node %d: %v", i+1, err)
				}
				if err := a.ZAdd(ctx, claims, goredis.Z{Score: 11, Member: "intruder"}).Err(); err != nil {
					t.Fatalf("node %d: %v", i+1, err)
				}
				if err := a.PExpire(ctx, claims, time.Second).Err(); err != nil {
					t.Fatalf("node %d: %v", i+1, err)
				}
			}
			h, err := try()
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = h.Release(ctx) }()
			if h.Token() <= 11 {
				t.Fatalf("token %d: the nodes' counters were at 10 and token 11 was another owner's on every node; want a token above 11", h.Token())
			}
			owner := h.(*redlock.Handle).Owner()
			for i, a := range adm {
				if s, err := a.ZScore(ctx, claims, owner).Result(); err != nil || int64(s) != h.Token() {
					t.Errorf("node %d: our claim is %v (%v), want %d", i+1, s, err, h.Token())
				}
				if s, err := a.ZScore(ctx, claims, "intruder").Result(); err != nil || s != 11 {
					t.Errorf("node %d: the other owner's claim is %v (%v), want 11", i+1, s, err)
				}
				// The claims live as long as the holders' leases (30s),
				// not the 1s the test gave them.
				if d, err := a.PTTL(ctx, claims).Result(); err != nil || d < 20*time.Second || d > locker.DefaultTTL {
					t.Errorf("node %d: the claims expire in %v (%v), want the lease (%v)", i+1, d, err, locker.DefaultTTL)
				}
			}
		})
	}
	t.Run("Bounded", func(t *testing.T) {
		key := uniqueKey(t)
		_, rw := l.FamilyNames(key)
		claims := rw + ":claims"
		var zs []goredis.Z
		for i := 1; i <= 1024; i++ {
			zs = append(zs, goredis.Z{Score: float64(i), Member: fmt.Sprintf("old-%d", i)})
		}
		for i, a := range adm {
			if err := a.Set(ctx, rw+":fence", 1024, 0).Err(); err != nil {
				t.Fatalf("node %d: %v", i+1, err)
			}
			if err := a.ZAdd(ctx, claims, zs...).Err(); err != nil {
				t.Fatalf("node %d: %v", i+1, err)
			}
			if err := a.PExpire(ctx, claims, time.Minute).Err(); err != nil {
				t.Fatalf("node %d: %v", i+1, err)
			}
		}
		h, err := l.TryAcquireRead(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = h.Release(ctx) }()
		if h.Token() != 1025 {
			t.Errorf("token %d, want 1025 (counters at 1024, no other claim above)", h.Token())
		}
		for i, a := range adm {
			if n, err := a.ZCard(ctx, claims).Result(); err != nil || n != 1024 {
				t.Errorf("node %d: %d claims (%v), want the latest 1024", i+1, n, err)
			}
			if _, err := a.ZScore(ctx, claims, "old-1").Result(); err != goredis.Nil {
				t.Errorf("node %d: the oldest claim is still there (%v)", i+1, err)
			}
		}
	})
}

// A claim whose reply is lost, and which go-redis sends again on a new
// connection, is accepted again: the node has the same owner's claim of
// the same token. The reader gets the token its grants gave (1, the
// key's first), not a greater one of a claim retried as if another owner
// had taken it.
func TestFamilyClaimReplayed(t *testing.T) {
	addrs := nodeAddrs(t, 3)
	adm := admins(t, addrs)
	var cs []goredis.UniversalClient
	var pxs []*testserver.Proxy
	for _, a := range addrs {
		px := testserver.NewProxy(t, a)
		pxs = append(pxs, px)
		c := goredis.NewClient(&goredis.Options{
			Addr:                  px.Addr(),
			ContextTimeoutEnabled: true,
			DialTimeout:           2 * time.Second,
			// The retry waits for the test to heal the path.
			MinRetryBackoff: 400 * time.Millisecond,
			MaxRetryBackoff: 500 * time.Millisecond,
		})
		t.Cleanup(func() { _ = c.Close() })
		cs = append(cs, c)
	}
	// A 30s TTL gives a node timeout of 3s: room for the delays and the retry.
	l := redlock.New(cs, redlock.WithDefaultTTL(30*time.Second))
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	ctx := testCtx(t, 30*time.Second)
	key := uniqueKey(t)
	// Contact every node and load the scripts first.
	warm, err := l.TryAcquireRead(ctx, key+"/warm-up")
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_, rw := l.FamilyNames(key)

	// Nodes 1 and 2 answer a second late: the grant, then the claim,
	// whose replies are lost once the claim has run there.
	pxs[0].Latency(t, time.Second)
	pxs[1].Latency(t, time.Second)
	type result struct {
		h   locker.Handle
		err error
	}
	res := make(chan result, 1)
	go func() {
		h, err := l.TryAcquireRead(ctx, key)
		res <- result{h, err}
	}()
	for _, a := range adm[:2] {
		for {
			n, err := a.ZCard(ctx, rw+":claims").Result()
			if err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				break
			}
			if len(res) > 0 {
				r := <-res
				t.Fatalf("the reader's claim was never seen on nodes 1 and 2 before TryAcquireRead returned (%v, %v)", r.h, r.err)
			}
			time.Sleep(2 * time.Millisecond) // polling the server's state: no signal to wait on
		}
	}
	pxs[0].ResetAll(t)
	pxs[1].ResetAll(t)
	pxs[0].Heal(t)
	pxs[1].Heal(t)
	r := <-res
	if r.err != nil {
		t.Fatalf("a reader whose claims were replayed: %v", r.err)
	}
	defer func() { _ = r.h.Release(ctx) }()
	if r.h.Token() != 1 {
		t.Errorf("token %d, want 1: the replayed claims were refused, and a greater token claimed", r.h.Token())
	}
}
