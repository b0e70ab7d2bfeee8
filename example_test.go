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

// TryDo does the work only if no one else is doing it: the second click on
// "pay" while the first is being charged gets 409 Conflict.
func ExampleTryDo() {
	l := memlock.New()
	defer l.Close()
	ctx := context.Background()

	charge := func(orderID string) int {
		err := locker.TryDo(ctx, l, "payment/"+orderID, func(ctx context.Context, h locker.Handle) error {
			// ... charge the card, writing with h.Token() as the fence ...
			return nil
		})
		switch {
		case errors.Is(err, locker.ErrNotAcquired):
			return 409 // being charged by another request right now
		case err != nil:
			return 500
		}
		return 200
	}

	// A request holding the order's lock is still running...
	h, _ := l.Acquire(ctx, "payment/42")
	fmt.Println("second click:", charge("42"))
	_ = h.Release(ctx)
	fmt.Println("after the first finished:", charge("42"))
	// Output:
	// second click: 409
	// after the first finished: 200
}

// HandleContext ties work to the lock: its context ends the moment the lock
// is lost, with the reason as its cause.
func ExampleHandleContext() {
	store := memlock.NewStore()
	l := store.NewLocker()
	defer l.Close()
	ctx := context.Background()

	h, _ := l.Acquire(ctx, "reports/daily")
	work, stop := locker.HandleContext(ctx, h)
	defer stop()

	store.Revoke("reports/daily") // an operator deletes the lock
	<-work.Done()
	fmt.Println("lost:", errors.Is(context.Cause(work), locker.ErrLost))
	// Output:
	// lost: true
}

// Lead runs the leader's work on whichever instance holds the key, and
// hands leadership on when the leader goes.
func ExampleLead() {
	l := memlock.New()
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())

	err := locker.Lead(ctx, l, "leader/scheduler", func(ctx context.Context, h locker.Handle) error {
		fmt.Println("leading, term token > 0:", h.Token() > 0)
		cancel() // in real code: run until ctx ends (shutdown or loss)
		<-ctx.Done()
		return nil
	})
	fmt.Println(errors.Is(err, context.Canceled))
	// Output:
	// leading, term token > 0: true
	// true
}

// A holder describes itself with WithOwner, and Inspect tells an operator
// who holds the key.
func ExampleWithOwner() {
	ctx := context.Background()
	l := memlock.NewStore().NewLocker()
	defer l.Close()
	h, err := l.Acquire(ctx, "nightly-report", locker.WithOwner("host=web-3 pid=4182 cmd=report.sh"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer h.Release(ctx)

	info, err := l.Inspect(ctx, "nightly-report")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(info.Held, info.Owner)
	// Output: true host=web-3 pid=4182 cmd=report.sh
}
