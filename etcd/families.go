package etcd

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// The Locker has every lock family: semaphores (locker.Semaphorer) and
// reader-writer locks (locker.ReadWriter), each in a keyspace of its own,
// granted, renewed, lost and released like the mutex: a waiter key per
// contender on the Locker's lease for its TTL, ordered by create revision,
// the create revision its fencing token. See the package documentation
// ("Lock families") for the algorithms.
var (
	_ locker.Semaphorer = (*Locker)(nil)
	_ locker.ReadWriter = (*Locker)(nil)
)

// AcquireSemaphore waits until one of the n permits of key is held, ctx
// ends, or the Locker is closed: its waiter key is among the n oldest of
// the semaphore's directory. Waiters get permits in the order they arrived
// (the create revisions of their keys). A key held or waited for with
// another n fails at once with an error wrapping locker.ErrLimitMismatch.
func (l *Locker) AcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	const op = "acquire-semaphore"
	if n < 1 {
		return nil, badLimit(op, key, n)
	}
	return backend.AsHandle(l.acquire(ctx, op, key, semaphoreKind(n), true, opts))
}

// TryAcquireSemaphore takes one of the n permits of key if fewer than n
// keys are in the semaphore's directory (no permit free, or others waiting
// first: an error wrapping locker.ErrNotAcquired), writing nothing to the
// server when it fails.
func (l *Locker) TryAcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	const op = "try-acquire-semaphore"
	if n < 1 {
		return nil, badLimit(op, key, n)
	}
	return backend.AsHandle(l.acquire(ctx, op, key, semaphoreKind(n), false, opts))
}

func badLimit(op, key string, n int) error {
	return backend.KeyError(op, key, fmt.Errorf("%w: a semaphore's limit must be at least 1, got %d", locker.ErrInvalidOption, n))
}

// AcquireRead waits until key is held for reading: no writer's key older
// than the reader's own is left in the directory (writers that came first,
// holding or waiting, go first).
func (l *Locker) AcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "acquire-read", key, readKind, true, opts))
}

// TryAcquireRead takes key for reading if no writer holds it or waits for
// it, and fails with an error wrapping locker.ErrNotAcquired otherwise,
// writing nothing to the server in that case.
func (l *Locker) TryAcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "try-acquire-read", key, readKind, false, opts))
}

// AcquireWrite waits until key is held for writing: no key, reader's or
// writer's, older than the writer's own is left in the directory.
func (l *Locker) AcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "acquire-write", key, writeKind, true, opts))
}

// TryAcquireWrite takes key for writing if nobody holds it or waits for
// it, and fails with an error wrapping locker.ErrNotAcquired otherwise,
// writing nothing to the server in that case.
func (l *Locker) TryAcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "try-acquire-write", key, writeKind, false, opts))
}

// lockKind is what a contender asks for: the mutex, a read or write lock,
// or a permit of a semaphore of limit.
type lockKind struct {
	family family
	write  bool // a write lock (family rw)
	limit  int  // a semaphore's n (family sem)
}

type family uint8

const (
	mutexFamily family = iota
	rwFamily
	semFamily
)

var (
	mutexKind = lockKind{family: mutexFamily}
	readKind  = lockKind{family: rwFamily}
	writeKind = lockKind{family: rwFamily, write: true}
)

func semaphoreKind(n int) lockKind { return lockKind{family: semFamily, limit: n} }

// The directories of the families below the prefix. The mutex's is
// <prefix>/<EncodeKey(key)>/; the reader-writer lock's and the semaphore's
// are <prefix>/%rw/<EncodeKey(key)>/ and <prefix>/%sem/<EncodeKey(key)>/.
// EncodeKey escapes '%' as "%25", so no encoded key begins with "%r" or
// "%s": no mutex directory is, or lies below, "%rw/" or "%sem/" (nor the
// release records' "%released/"), and EncodeKey has no '/', so no
// directory of one family is a prefix of another's.
const (
	rwSpace  = "%rw/"
	semSpace = "%sem/"
)

// turn says where a contender's key goes and what decides its turn.
type turn struct {
	// dir is the lock's directory: the keys of all its contenders lie
	// below it, ordered by create revision.
	dir string
	// sub is the directory of the contender's own key: dir for the
	// mutex; dir+"r/" or dir+"w/" for a reader or a writer; dir+"<n>/"
	// for a permit of a semaphore of n.
	sub string
	// block is the range (a prefix) whose keys older than the
	// contender's own keep it waiting: dir for the mutex and a writer
	// (every older key), dir+"w/" for a reader (the older writers'). A
	// semaphore's contender waits while n keys of dir are older.
	block string
	limit int // a semaphore's n; 0 for the other families
	// desc is the value of the contender's key: the holder's
	// locker.WithOwner description, which Inspect reports (the mutex
	// only; the families' keys have none).
	desc string
}

// turnOf returns the turn of a contender of kind k for key under prefix.
func turnOf(prefix, key string, k lockKind) turn {
	switch k.family {
	case rwFamily:
		dir := prefix + "/" + rwSpace + EncodeKey(key) + "/"
		if k.write {
			return turn{dir: dir, sub: dir + "w/", block: dir}
		}
		return turn{dir: dir, sub: dir + "r/", block: dir + "w/"}
	case semFamily:
		dir := prefix + "/" + semSpace + EncodeKey(key) + "/"
		return turn{dir: dir, sub: dir + strconv.Itoa(k.limit) + "/", block: dir, limit: k.limit}
	default:
		dir := LockDir(prefix, key)
		return turn{dir: dir, sub: dir, block: dir}
	}
}

// selfInBlock reports whether the contender's own key lies in its block
// range (the mutex, a writer).
func (t turn) selfInBlock() bool { return strings.HasPrefix(t.sub, t.block) }

// firstRead is the read that goes with the create of an Acquire: the
// oldest key of the block range (the contender holds if that is its own,
// or, for a reader, if there is none), or, for a semaphore, the number of
// keys in the directory (it holds if there are at most n, its own among
// them).
func (t turn) firstRead() clientv3.Op {
	if t.limit > 0 {
		return clientv3.OpGet(t.dir, clientv3.WithPrefix(), clientv3.WithCountOnly())
	}
	return clientv3.OpGet(t.block, clientv3.WithFirstCreate()...)
}

// admittedAtOnce reports, from the answer r to firstRead in the
// transaction that created the contender's key (create revision rev, the
// newest of the directory then), whether it holds.
func (t turn) admittedAtOnce(r *clientv3.TxnResponse, i int, rev int64) bool {
	rr := r.Responses[i].GetResponseRange()
	if t.limit > 0 {
		return rr.GetCount() <= int64(t.limit)
	}
	return t.blockClear(rr.GetKvs(), rev)
}

// blockClear reports whether first, the oldest key of the block range,
// lets the contender of create revision rev hold: its own key, a key newer
// than it, or none when its own key is not in the range (a reader).
func (t turn) blockClear(first []*mvccpb.KeyValue, rev int64) bool {
	if len(first) == 0 {
		return !t.selfInBlock()
	}
	return first[0].CreateRevision >= rev
}

// otherLimits returns, for a semaphore, the two ranges of its directory
// outside its contender's sub-directory: the keys of contenders that asked
// for another n. Both are empty while every holder and waiter agrees.
func (t turn) otherLimits() (lo, hi [2]string) {
	return [2]string{t.dir, t.sub}, [2]string{clientv3.GetPrefixRangeEnd(t.sub), clientv3.GetPrefixRangeEnd(t.dir)}
}

// sameLimit is the compare that refuses a semaphore's create when a key of
// another n is in the directory; nil for the other families.
func (t turn) sameLimit() []clientv3.Cmp {
	if t.limit == 0 {
		return nil
	}
	lo, hi := t.otherLimits()
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(lo[0]), "=", 0).WithRange(lo[1]),
		clientv3.Compare(clientv3.CreateRevision(hi[0]), "=", 0).WithRange(hi[1]),
	}
}

// otherLimitReads reads one key of each range of otherLimits.
func (t turn) otherLimitReads() []clientv3.Op {
	if t.limit == 0 {
		return nil
	}
	lo, hi := t.otherLimits()
	return []clientv3.Op{
		clientv3.OpGet(lo[0], clientv3.WithRange(lo[1]), clientv3.WithKeysOnly(), clientv3.WithLimit(1)),
		clientv3.OpGet(hi[0], clientv3.WithRange(hi[1]), clientv3.WithKeysOnly(), clientv3.WithLimit(1)),
	}
}

// limitMismatch returns the error of a semaphore whose directory has a key
// of another n, from the answers to otherLimitReads (rs), or nil.
func (t turn) limitMismatch(rs []*pb.ResponseOp) error {
	for _, r := range rs {
		kvs := r.GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			continue
		}
		other := "another limit"
		rest := strings.TrimPrefix(string(kvs[0].Key), t.dir)
		if i := strings.IndexByte(rest, '/'); i > 0 {
			other = rest[:i]
		}
		return fmt.Errorf("%w: the key is a semaphore of %s, asked for %d", locker.ErrLimitMismatch, other, t.limit)
	}
	return nil
}

// waitRead is the waiter's read of what keeps it waiting (see waitTurn):
// for the mutex and the reader-writer lock, the newest key of the block
// range older than rev (the one to watch); for a semaphore, the n+1
// newest keys of the directory older than rev, newest first (the waiter
// holds when there are fewer than n).
func (t turn) waitRead(rev int64) clientv3.Op {
	if t.limit > 0 {
		return clientv3.OpGet(t.dir, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend),
			clientv3.WithMaxCreateRev(rev-1), clientv3.WithLimit(int64(t.limit)+1))
	}
	return clientv3.OpGet(t.block, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(rev-1))...)
}

// trySemaphore creates the waiter key me of a semaphore's contender (put)
// only if fewer than n keys are in the directory, all of the same n, and
// writes nothing otherwise. A count cannot be compared in a transaction:
// the create is guarded by "no key of the directory was created after
// revision seen", where seen is that of the read that counted (0 at
// first: the directory is empty), and the read is made again, in the
// same transaction's Else branch, when that does not hold. It returns the
// key's create revision.
func (l *Locker) trySemaphore(ctx context.Context, ls *lease, t turn, me string, put clientv3.Op) (int64, error) {
	var seen int64
	for {
		tctx, tcancel := context.WithTimeout(ctx, attemptWait(ls.ttl))
		resp, err := l.cli.Txn(tctx).
			If(clientv3.Compare(clientv3.CreateRevision(t.dir), "<", seen+1).WithPrefix(),
				clientv3.Compare(clientv3.CreateRevision(me), "=", 0)).
			Then(put).
			Else(append([]clientv3.Op{
				clientv3.OpGet(me, clientv3.WithKeysOnly()),
				clientv3.OpGet(t.dir, clientv3.WithPrefix(), clientv3.WithCountOnly()),
			}, t.otherLimitReads()...)...).
			Commit()
		tcancel()
		if err != nil {
			return 0, err
		}
		if resp.Succeeded {
			return resp.Header.Revision, nil
		}
		if own := resp.Responses[0].GetResponseRange().GetKvs(); len(own) > 0 {
			return 0, &leftoverKey{rev: own[0].CreateRevision}
		}
		if err := t.limitMismatch(resp.Responses[2:]); err != nil {
			return 0, err
		}
		if resp.Responses[1].GetResponseRange().GetCount() >= int64(t.limit) {
			return 0, locker.ErrNotAcquired
		}
		// A key was created since the last count, and permits are free:
		// count again.
		seen = resp.Header.Revision
		if err := ctx.Err(); err != nil {
			return 0, &notSent{err}
		}
	}
}

// notSent is the error of a trySemaphore whose ctx ended before it sent
// its next create: nothing of it can land.
type notSent struct{ err error }

func (e *notSent) Error() string { return e.err.Error() }
func (e *notSent) Unwrap() error { return e.err }

// leftoverKey says a TryAcquire found a key of its own name on the server
// (a put of unknown outcome that landed after all; see resolve): its
// create revision, so that it can be deleted.
type leftoverKey struct{ rev int64 }

func (e *leftoverKey) Error() string {
	return "etcd: a waiter key of this name was already on the server"
}

// markTurn re-puts a semaphore holder's key (same value, same lease,
// guarded by its create revision) once it was admitted after waiting: the
// waiter behind it watches it (see waitTurn), and learns so that it is now
// the first waiter. Attempts are retried until the server answers, the
// lock ends, or the Locker closes; a mark that never lands only delays that
// waiter until the holder's key goes.
func (l *Locker) markTurn(h *Handle) {
	l.life.Go(func() {
		ctx, cancel := context.WithCancel(l.life.Closing())
		defer cancel()
		stop := context.AfterFunc(ctxOf(h.state.Done()), cancel)
		defer stop()
		b := retryBackoff()
		for {
			actx, acancel := context.WithTimeout(ctx, attemptWait(h.ls.ttl))
			_, err := l.cli.Txn(actx).
				If(clientv3.Compare(clientv3.CreateRevision(h.ekey), "=", h.rev)).
				Then(clientv3.OpPut(h.ekey, "", clientv3.WithIgnoreLease())).
				Commit()
			acancel()
			if err == nil || ctx.Err() != nil || !retryable(err) || !b.Wait(ctx) {
				return
			}
		}
	})
}
