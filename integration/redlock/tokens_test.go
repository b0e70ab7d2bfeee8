package redlock_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
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
