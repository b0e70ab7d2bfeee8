package locker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/memlock"
)

// One nightly job among many instances: whoever gets the lock runs it, the
// others skip instead of waiting. Two Lockers on one memlock Store stand in
// for two instances sharing a lock server.
func ExampleLocker_TryAcquire() {
	ctx := context.Background()
	store := memlock.NewStore()
	instanceA, instanceB := store.NewLocker(), store.NewLocker()
	defer instanceA.Close()
	defer instanceB.Close()

	for _, l := range []struct {
		name string
		l    locker.Locker
	}{{"A", instanceA}, {"B", instanceB}} {
		h, err := l.l.TryAcquire(ctx, "cron/nightly-report")
		switch {
		case errors.Is(err, locker.ErrNotAcquired):
			fmt.Printf("%s: another instance runs the report; skipping\n", l.name)
			continue
		case err != nil:
			fmt.Printf("%s: %v\n", l.name, err)
			continue
		}
		fmt.Printf("%s: running the report\n", l.name)
		defer h.Release(ctx)
	}
	// Output:
	// A: running the report
	// B: another instance runs the report; skipping
}

// Do holds the lock while fn runs and releases it afterwards, whatever fn
// returns. fn's context ends if the lock is lost, so long work can stop, and
// fn gets the handle, whose fencing token goes with every write.
func ExampleDo() {
	ctx := context.Background()
	l := memlock.NewStore().NewLocker()
	defer l.Close()

	err := locker.Do(ctx, l, "order/42/payment", func(ctx context.Context, h locker.Handle) error {
		// e.g. UPDATE orders SET state = 'charged', fence = $2 WHERE id = 42 AND fence <= $2
		fmt.Println("charging order 42 once, fencing token", h.Token())
		return nil
	})
	fmt.Println("err:", err)

	h, err := l.TryAcquire(ctx, "order/42/payment")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("released after Do")
	h.Release(ctx)
	// Output:
	// charging order 42 once, fencing token 1
	// err: <nil>
	// released after Do
}

// Open picks a backend by URL; the backend's package must be imported (here
// memlock, whose mem://NAME is a keyspace shared within the process).
func ExampleOpen() {
	ctx := context.Background()
	l, err := locker.Open(ctx, "mem://example-open?ttl=10s")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()

	h, err := l.Acquire(ctx, "reports/daily")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("holding", h.Key(), "with a token:", h.Token() > 0)
	h.Release(ctx)

	_, err = locker.Open(ctx, "zk://localhost:2181")
	fmt.Println(err)
	// Output:
	// holding reports/daily with a token: true
	// locker: unknown scheme "zk" (forgotten import?)
}

// account is a protected resource that takes fencing tokens: it refuses a
// write whose token is below the last one it accepted, as
//
//	UPDATE accounts SET balance = $2, fence = $3 WHERE id = $1 AND fence <= $3
//
// would, by updating no row.
type account struct {
	mu      sync.Mutex
	fence   int64
	balance int
}

func (a *account) write(token int64, balance int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if token < a.fence {
		return fmt.Errorf("stale token %d: already saw %d", token, a.fence)
	}
	a.fence, a.balance = token, balance
	return nil
}

// A holder that lost its lock without noticing (a long GC pause, a network
// partition) must not overwrite the work of the holder that came after it.
// The lock cannot stop that write; the token lets the resource refuse it.
func Example_fencing() {
	ctx := context.Background()
	store := memlock.NewStore()
	workerA, workerB := store.NewLocker(), store.NewLocker()
	defer workerB.Close()
	acct := &account{}

	hA, _ := workerA.Acquire(ctx, "account/1")
	balanceSeenByA := 100 // A reads, then stalls before writing...

	// ...and loses the lock meanwhile. A pause that outlives the lease is
	// hard to stage in an example; closing A's Locker ends its lock the same
	// way, so that B can take it.
	workerA.Close()
	hB, _ := workerB.Acquire(ctx, "account/1")
	fmt.Println("B writes with token", hB.Token(), "->", acct.write(hB.Token(), 250))
	hB.Release(ctx)

	// A wakes up and writes what it computed before the pause.
	fmt.Println("A writes with token", hA.Token(), "->", acct.write(hA.Token(), balanceSeenByA-30))
	fmt.Println("balance:", acct.balance)
	// Output:
	// B writes with token 2 -> <nil>
	// A writes with token 1 -> stale token 1: already saw 2
	// balance: 250
}
