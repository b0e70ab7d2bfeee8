package redlock

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/backoff"
	"github.com/go-locker/locker/internal/lease"
	"github.com/go-locker/locker/redis/internal/releases"
)

// The lock families over the nodes: semaphores and reader-writer locks
// (see "Lock families" in doc.go for the algorithm and why it is safe).
// They run the mutex's rounds (round.go) with scripts of their own
// (famscripts.go), and add a queue that every node keeps, in which a
// waiter holds a place by a ticket that the nodes order alike.
var (
	_ locker.Semaphorer = (*Locker)(nil)
	_ locker.ReadWriter = (*Locker)(nil)
)

// MaxSemaphoreLimit is the largest n a semaphore may have: each grant looks
// at every permit slot of the key on the node, in one script.
const MaxSemaphoreLimit = 1024

// lockKind is what a lock is: the mutex, or a lock of a family.
type lockKind uint8

const (
	mutexLock  lockKind = iota
	permitLock          // one permit of a semaphore
	readLock
	writeLock
)

// queued is a waiter's place in a family's queue: its id on the nodes, its
// ticket (the provisional ticket a majority gave it, else the largest of
// those a majority gave), and
// how long its entry lives on a node unless its rounds refresh it.
type queued struct {
	id     string
	ticket int64
	lease  time.Duration
}

// famKeysFor returns the names of key's lock of family kind (n: a
// semaphore's limit). They share the mutex's hash tag and encoding, and
// continue it with ":sem" or ":rw", which no name of the mutex does: the
// mutex, the reader-writer lock and the semaphore of one key are three
// locks.
func (l *Locker) famKeysFor(key string, kind lockKind, n int) keys {
	fam := ":rw"
	if kind == permitLock {
		fam = ":sem"
	}
	base := l.cfg.Prefix + "{" + base64.RawURLEncoding.EncodeToString([]byte(key)) + "}" + fam
	k := keys{fence: base + ":fence", channel: base + ":wake", released: base + releases.Suffix, kind: kind, base: base, n: n}
	if kind == writeLock {
		k.lock = base + ":w"
	}
	return k
}

// permitKey is the name of permit slot i of a semaphore.
func permitKey(k keys, i int) string { return k.base + ":s:" + strconv.Itoa(i) }

// AcquireSemaphore waits until one of the n permits of key is held on a
// majority of the nodes, ctx is done, or the Locker is closed. Waiters are
// admitted in the order of their tickets (see "Lock families" in the
// package documentation). n must be within [1, MaxSemaphoreLimit], and
// the same for every holder and waiter of key: else the error wraps
// locker.ErrInvalidOption or locker.ErrLimitMismatch.
func (l *Locker) AcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.famAcquire(ctx, "acquire-semaphore", key, permitLock, n, opts, true))
}

// TryAcquireSemaphore makes one attempt at a permit of key (a few rounds
// when contenders split the nodes), and fails with an error wrapping
// locker.ErrNotAcquired when every permit is held or waiters come first.
func (l *Locker) TryAcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.famAcquire(ctx, "try-acquire-semaphore", key, permitLock, n, opts, false))
}

// AcquireRead waits until key is held for reading on a majority of the
// nodes: no writer holds it there, nor waits ahead of this reader.
func (l *Locker) AcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.famAcquire(ctx, "acquire-read", key, readLock, 0, opts, true))
}

// TryAcquireRead takes key for reading if no writer holds it or waits for
// it, and fails with an error wrapping locker.ErrNotAcquired otherwise.
func (l *Locker) TryAcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.famAcquire(ctx, "try-acquire-read", key, readLock, 0, opts, false))
}

// AcquireWrite waits until key is held for writing on a majority of the
// nodes: no reader or writer holds it there, nor waits ahead of this
// writer.
func (l *Locker) AcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.famAcquire(ctx, "acquire-write", key, writeLock, 0, opts, true))
}

// TryAcquireWrite takes key for writing if nobody holds it or waits for
// it, and fails with an error wrapping locker.ErrNotAcquired otherwise.
func (l *Locker) TryAcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.famAcquire(ctx, "try-acquire-write", key, writeLock, 0, opts, false))
}

// famAcquire is the families' acquire (wait) and try-acquire.
func (l *Locker) famAcquire(ctx context.Context, op, key string, kind lockKind, n int, opts []locker.Option, wait bool) (*Handle, error) {
	ctx, done, err := l.life.Enter(ctx, op, key)
	if err != nil {
		return nil, err
	}
	defer done()
	if kind == permitLock && (n < 1 || n > MaxSemaphoreLimit) {
		return nil, backend.KeyError(op, key, fmt.Errorf("%w: a semaphore's limit must be within [1, %d], got %d", locker.ErrInvalidOption, MaxSemaphoreLimit, n))
	}
	tm, err := l.cfg.lockTiming(opts)
	if err != nil {
		return nil, backend.KeyError(op, key, err)
	}
	k := l.famKeysFor(key, kind, n)
	if !wait {
		h, err := l.try(ctx, key, k, tm)
		return h, backend.KeyError(op, key, err)
	}
	h, err := l.famWait(ctx, key, k, tm)
	return h, backend.KeyError(op, key, err)
}

// limitMismatch is the error of a round on a semaphore whose holders or
// waiters have another limit on some node: refused, never obeyed.
func (l *Locker) limitMismatch(grants outcome[grant]) error {
	for i := range l.clients {
		if grants.ok(i) && grants.v[i].mismatch > 0 {
			return fmt.Errorf("%w: the key is a semaphore of %d on %s", locker.ErrLimitMismatch, grants.v[i].mismatch, l.addrs[i])
		}
	}
	return nil
}

// famWait is every Acquire, the mutex's and a family's: a first round
// behind every waiter, which queues the waiter on the nodes that refuse
// it; then, subscribed to the key's wake channel, a place in the queue on
// a majority (enqueue, if the first round did not get one), and rounds at
// the front of it, each woken by a message naming this waiter, or by a
// back-off that also refreshes the place before its lease ends. A wait that ends without the lock leaves the queue on every node
// (dequeue), which wakes the waiters it held back.
func (l *Locker) famWait(ctx context.Context, key string, k keys, tm timing) (h *Handle, err error) {
	q := &queued{id: k.famKind() + lease.NewOwner(), lease: tm.ttl}
	defer func() {
		if h == nil {
			l.dequeue(k, q, tm)
		}
	}()
	// When the key's channel is subscribed already on a majority (another
	// waiter of this Locker, or the linger of the last one: see
	// pubsub.go), the waiter watches it before its first round, so that it
	// hears every release that round does not see.
	var w *waiter
	if l.subs.subscribed(k.channel, l.quorum) {
		w = l.subs.watch(k.channel, q.id)
		defer w.leave()
	}
	h, r, err := l.round(ctx, key, k, tm, q, -1)
	if h != nil || err != nil {
		return h, err
	}
	if r.queued >= l.quorum {
		q.ticket = r.ticket
	}
	// The round right after the subscription covers a release between the
	// first round and the subscription, and writes the waiter's ticket on
	// the nodes: needless when the waiter watched before its first round
	// and a majority queued it with the ticket itself (a node that gave it
	// a lower one, or did not queue it, is corrected by its next round:
	// safety never depends on the queue, and its order holds on that
	// majority).
	settled := w != nil && r.queued >= l.quorum && r.ticketAgree >= l.quorum
	if w == nil {
		w = l.subs.watch(k.channel, q.id)
		defer w.leave()
	}
	if err := w.awaitSubscribed(ctx, l.quorum, tm.nodeTimeout); err != nil {
		return nil, l.life.Why(ctx, err)
	}
	// Rounds refresh the place in the queue: one at least every refresh.
	refresh := min(l.cfg.RetryInterval, tm.ttl/3)
	unreachable := 0
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	pause := backoff.New(splitBackoff, refresh)
	prefer := r.prefer
	for {
		last := r
		if q.ticket == 0 {
			r, err = l.enqueue(ctx, k, q, tm)
			if err != nil {
				if ctx.Err() != nil {
					return nil, l.waitEnded(ctx, last)
				}
				return nil, err
			}
		}
		if q.ticket != 0 && !settled {
			h, r, err = l.round(ctx, key, k, tm, q, prefer)
			if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				return nil, l.waitEnded(ctx, last)
			}
			if h != nil || err != nil {
				return h, err
			}
			prefer = r.prefer
		}
		if r.unreachable() {
			if unreachable++; unreachable >= maxUnreachableRounds {
				return nil, r.err()
			}
		} else {
			unreachable = 0
		}
		// Refused by a majority where a holder has the key, or where it
		// is free with other waiters queued ahead: the message that names
		// this waiter wakes it, else the end of the lease that blocks it
		// (a crashed holder announces nothing), else the refresh. A node
		// that refuses a free key for the waiters ahead reminds them
		// (famAcquireScript), so the head, when it is not this waiter,
		// has been told, whether the release's wake-up named another
		// waiter (the nodes' queues did not agree yet: a waiter's ticket
		// is written on a node by its first round that reaches it) or went
		// out before the head subscribed; and the head's own rounds, when
		// it is refused, remind this waiter if it is ahead there.
		// Otherwise (a split, failed nodes) a short back-off.
		var d time.Duration
		if r.held {
			pause.Reset()
			d = refresh
			if r.holderLeft > 0 {
				d = min(r.holderLeft+time.Millisecond, refresh)
			}
			d += backoff.Jitter(min(d/4, 20*time.Millisecond) + time.Millisecond)
		} else {
			d = pause.Next()
		}
		timer.Reset(d)
		select {
		case <-w.wake:
			// The other nodes' messages are on their way: a round before
			// a majority deleted the lock would be refused.
			w.awaitMajority(ctx, l.quorum)
		case <-timer.C:
			w.woke.Store(0)
		case <-ctx.Done(): // also when Close begins (Life.Enter)
			return nil, l.waitEnded(ctx, r)
		}
		timer.Stop()
		settled = false
	}
}

// enqueue puts q in k's queue on every node and sets its ticket, the
// provisional ticket a majority of the nodes gave (else the largest: see
// agreed), as soon as a majority answered (its first round writes it
// back: see famAcquireScript).
// Otherwise q.ticket stays 0 and the result says how many nodes failed.
func (l *Locker) enqueue(ctx context.Context, k keys, q *queued, tm timing) (roundResult, error) {
	r := roundResult{n: len(l.clients), quorum: l.quorum, prefer: -1}
	c := *q // the requests' copy (see round)
	type answer struct {
		ticket   int64
		mismatch int
	}
	res, err := fanout(l, ctx, ctx, l.closing, l.all, tm.nodeTimeout,
		func(ctx context.Context, _ int, cl goredis.UniversalClient) (answer, error) {
			t, m, err := runEnqueue(ctx, cl, k, &c)
			return answer{t, m}, err
		}, nil, func(o outcome[answer]) bool {
			// A majority is enough: a node that answers later queues the
			// waiter with a provisional ticket, which its first round
			// corrects.
			n := 0
			for i := range l.clients {
				if o.ok(i) {
					n++
				}
			}
			return n >= l.quorum
		})
	if err != nil {
		return r, err
	}
	var tickets []int64
	answered := 0
	for i := range l.clients {
		switch {
		case !res.ok(i):
			r.failed++
			if r.firstErr == nil {
				r.firstErr = fmt.Errorf("%s: %w", l.addrs[i], res.err[i])
			}
		case res.v[i].mismatch > 0:
			return r, fmt.Errorf("%w: the key is a semaphore of %d on %s", locker.ErrLimitMismatch, res.v[i].mismatch, l.addrs[i])
		default:
			answered++
			if t := res.v[i].ticket; t > 0 { // 0: a late request, the waiter gone
				tickets = append(tickets, t)
			}
		}
	}
	if answered >= l.quorum {
		q.ticket, _ = agreed(tickets, l.quorum)
	}
	return r, nil
}

// dequeue takes q out of k's queue on every node, waking the waiters it
// held back, and waits for the nodes' answers at most the node timeout,
// whatever the caller's context (which has ended, most often).
func (l *Locker) dequeue(k keys, q *queued, tm timing) {
	q = &queued{id: q.id, ticket: q.ticket, lease: q.lease} // the requests' copy (see round)
	ctx, cancel := context.WithTimeout(context.Background(), tm.nodeTimeout)
	defer cancel()
	_, _ = fanout(l, ctx, context.Background(), nil, l.all, tm.nodeTimeout,
		func(ctx context.Context, _ int, c goredis.UniversalClient) (bool, error) {
			return runFamRelease(ctx, c, k, q.id, true, q, queueDrop)
		}, nil, nil)
}

// withdraw runs after a round of a waiter (or a semaphore's round that
// other nodes granted another slot) succeeded on granted, in the
// background: on every other node it gives back a grant the round got
// there (another permit slot) and takes the waiter q (if any) out of the
// queue.
func (l *Locker) withdraw(k keys, owner string, granted []int, q *queued, tm timing) {
	in := make([]bool, len(l.clients))
	for _, i := range granted {
		in[i] = true
	}
	var rest []int
	for i := range l.clients {
		if !in[i] {
			rest = append(rest, i)
		}
	}
	if len(rest) == 0 || !l.enter() {
		return
	}
	if q != nil {
		c := *q // the requests' copy (see round)
		q = &c
	}
	go func() {
		defer l.exit()
		ctx, cancel := context.WithTimeout(context.Background(), tm.nodeTimeout)
		defer cancel()
		_, _ = fanout(l, ctx, context.Background(), nil, rest, tm.nodeTimeout,
			func(ctx context.Context, _ int, c goredis.UniversalClient) (bool, error) {
				return runFamRelease(ctx, c, k, owner, true, q, queueDrop)
			}, nil, nil)
	}()
}

// readersSuffix names, under a reader-writer lock's base, the sorted set of
// its readers (R in the family scripts' prelude, luaFamily).
const readersSuffix = ":r"

// FamilyNames returns the prefixes of the names under which the Locker
// keeps key's semaphore and reader-writer lock on every node, for
// operators and tests. Under the semaphore's, ":s:<i>" is permit slot i
// (the holder's owner token, expiring with its lease) and ":n" the limit;
// under the reader-writer lock's, ":w" is the writer (likewise) and ":r"
// the readers (a sorted set of owner tokens scored by the time, on the
// node's clock in milliseconds, at which their leases end). Both have ":q"
// (the queue: waiter ids scored by ticket), ":qx" (the entries' leases),
// ":fence" (the counter of tickets and tokens: never delete or lower it),
// ":claims" (the tokens claimed: owner tokens scored by token; never
// delete it while the lock has holders) and ":wake" (the Pub/Sub channel on which waiters are woken).
func (l *Locker) FamilyNames(key string) (semaphore, readWrite string) {
	return l.famKeysFor(key, permitLock, 1).base, l.famKeysFor(key, readLock, 0).base
}
