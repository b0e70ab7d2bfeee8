package etcd

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker/internal/backoff"
)

// attemptWait bounds one attempt of a call the Locker retries (a grant, a
// create, a waiter's read, a revocation after a loss) for a lease of ttl:
// a third of the TTL, at least 1s and at most 5s. A member that stops
// answering while the lease stays alive (renewed through the others)
// costs one attempt; the next goes to another member.
func attemptWait(ttl time.Duration) time.Duration {
	return min(max(ttl/3, time.Second), 5*time.Second)
}

// codeUnavailable is gRPC's codes.Unavailable, the code of etcd's
// transient server errors (no leader, request timed out, leader changed).
const codeUnavailable = 14

// retryable reports whether a call that failed with err may succeed if
// sent again: no answer in time, a broken connection, no leader. Errors
// the server gave for the request itself (auth, permission, a lease not
// found) are not, nor a closed client.
func retryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || clientv3.IsConnCanceled(err) {
		return false
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codeUnavailable || errors.Is(err, rpctypes.ErrTooManyRequests)
	}
	return true
}

// retryBackoff paces the attempts of a call retried until the server
// answers (a create of unknown outcome, a guarded deletion, a read, a
// revocation after a loss): from 200ms up to 2s.
func retryBackoff() *backoff.Backoff { return backoff.New(200*time.Millisecond, 2*time.Second) }

// quickBackoff paces the retries of a call whose caller waits for the
// answer (a grant, a Release's deletion, the read of its verdict): from
// 100ms up to 1s.
func quickBackoff() *backoff.Backoff { return backoff.New(100*time.Millisecond, time.Second) }

// rewatch paces a watch that the server may keep cancelling (compaction,
// a member without a leader cancels each new watch at once): after a watch
// that ended within a second of starting, the next one waits a growing
// pause (retryBackoff); one that lasted longer starts the pauses afresh.
type rewatch struct {
	b       *backoff.Backoff
	started time.Time
}

// start marks the moment a watch is opened.
func (r *rewatch) start() { r.started = time.Now() }

// wait pauses before the next watch as described above, and reports false
// if ctx ended first.
func (r *rewatch) wait(ctx context.Context) bool {
	if r.b == nil {
		r.b = retryBackoff()
	}
	if time.Since(r.started) >= time.Second {
		r.b.Reset()
		return true
	}
	return r.b.Wait(ctx)
}

// maxGuards bounds how many waiter names of unknown fate (see guard) a
// Locker watches at once. Beyond it a name stays reserved but unwatched:
// should its put land, the key lasts until the lease ends (Close, or a
// loss).
const maxGuards = 64

// errUnknownOutcome marks an attempt whose create transaction got no
// answer: its put may still be applied. The name is guarded, and the
// attempt is made again with another name while the caller's context
// lasts.
var errUnknownOutcome = errors.New("etcd: the create transaction got no answer")

// deleteGuarded deletes key if its create revision is still rev, retrying
// with bounded attempts until the server answers or ctx ends.
func (l *Locker) deleteGuarded(ctx context.Context, key string, rev int64) error {
	b := retryBackoff()
	for {
		actx, cancel := context.WithTimeout(ctx, cleanupWait)
		_, err := l.cli.Txn(actx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
			Then(clientv3.OpDelete(key)).
			Commit()
		cancel()
		if err == nil {
			return nil
		}
		if !b.Wait(ctx) {
			return ctx.Err()
		}
	}
}

// resolve deals with the name of an attempt whose create transaction got
// no answer, so that its put may be applied at any later time (held by a
// slow or paused member). It reads the key; if the put has landed, it
// deletes that key (guarded by its create revision) and frees the name.
// If not, it keeps the name reserved (no contender of the Locker uses it
// again, so any creation of it is that put) and watches it, from the
// revision after the read, for as long as the lease lives: a creation is
// deleted, guarded, and the name freed. Without this, the put, applied
// after the clean-up, would leave a key on the Locker's lease (renewed)
// that no contender owns, the oldest of its directory: every other
// contender would wait behind it until the Locker closes.
//
// first is called once the first read has been answered (or given up).
func (l *Locker) resolve(ctx context.Context, name *waiterName, first func()) {
	defer first()
	ls := name.ls
	var from int64
	b := retryBackoff()
	for {
		actx, cancel := context.WithTimeout(ctx, cleanupWait)
		resp, err := l.cli.Get(actx, name.key)
		cancel()
		if err == nil {
			if len(resp.Kvs) > 0 {
				if l.deleteGuarded(ctx, name.key, resp.Kvs[0].CreateRevision) == nil {
					name.free()
				}
				return
			}
			from = resp.Header.Revision + 1
			break
		}
		if !b.Wait(ctx) {
			return
		}
	}
	first()
	// Not on the server at the read: the name need not keep the lease
	// from being retired (revoking it fails a late put and deletes a key
	// already on it), but stays reserved while the lease lives.
	name.drop()
	l.mu.Lock()
	ok := l.guards < maxGuards
	if ok {
		l.guards++
	}
	l.mu.Unlock()
	if !ok {
		return
	}
	defer func() {
		l.mu.Lock()
		l.guards--
		l.mu.Unlock()
	}()
	var rw rewatch
	for ctx.Err() == nil {
		var created int64
		rw.start()
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := l.cli.Watch(wctx, name.key, clientv3.WithRev(from), clientv3.WithFilterDelete())
	recv:
		for wr := range wch {
			if wr.Err() != nil || wr.Canceled {
				break // compacted, no leader, ...: read again
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					created = ev.Kv.CreateRevision
					break recv
				}
			}
		}
		wcancel()
		if created == 0 {
			if !rw.wait(ctx) {
				return
			}
			actx, cancel := context.WithTimeout(ctx, attemptWait(ls.ttl))
			resp, err := l.cli.Get(actx, name.key)
			cancel()
			if err != nil {
				continue // watch again from the same revision
			}
			if len(resp.Kvs) == 0 {
				from = resp.Header.Revision + 1
				continue
			}
			created = resp.Kvs[0].CreateRevision
		}
		if l.deleteGuarded(ctx, name.key, created) == nil {
			name.free()
		}
		return
	}
}
