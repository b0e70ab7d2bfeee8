package sqltable

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/backoff"
	"github.com/go-locker/locker/internal/lease"
)

// Semaphores and reader-writer locks: each key of a family is a queue of
// rows in the families table (famsql.go), granted first come, first served
// as they come within reach of the front. See "Semaphores and reader-writer
// locks" in the package documentation.

var (
	_ locker.Semaphorer = (*Locker)(nil)
	_ locker.ReadWriter = (*Locker)(nil)
)

// famReq is what an acquisition of a family asks for.
type famReq struct {
	family int
	kind   int
	lim    int // a semaphore's n; 1 for a reader or a writer
}

var (
	readReq  = famReq{famRW, kindRead, 1}
	writeReq = famReq{famRW, kindWrite, 1}
)

// AcquireSemaphore waits until one of the n permits of key is held, ctx is
// done, or the Locker is closed. Waiters get permits in the order they
// started waiting.
func (l *Locker) AcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.famAcquire(ctx, "acquire-semaphore", key, famReq{famSem, kindPermit, n}, opts, true))
}

// TryAcquireSemaphore takes one of the n permits of key if one is free and
// nobody waits for it, and fails with an error wrapping
// locker.ErrNotAcquired otherwise.
func (l *Locker) TryAcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.famAcquire(ctx, "try-acquire-semaphore", key, famReq{famSem, kindPermit, n}, opts, false))
}

// AcquireRead waits until key is held for reading: no writer holds it, and
// no writer that came first still waits for it.
func (l *Locker) AcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.famAcquire(ctx, "acquire-read", key, readReq, opts, true))
}

// TryAcquireRead takes key for reading if no writer holds it or waits for
// it, and fails with an error wrapping locker.ErrNotAcquired otherwise.
func (l *Locker) TryAcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.famAcquire(ctx, "try-acquire-read", key, readReq, opts, false))
}

// AcquireWrite waits until key is held for writing: no reader or writer
// holds it, and nobody who came first still waits for it.
func (l *Locker) AcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.famAcquire(ctx, "acquire-write", key, writeReq, opts, true))
}

// TryAcquireWrite takes key for writing if nobody holds it or waits for
// it, and fails with an error wrapping locker.ErrNotAcquired otherwise.
func (l *Locker) TryAcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.famAcquire(ctx, "try-acquire-write", key, writeReq, opts, false))
}

func (l *Locker) famAcquire(ctx context.Context, op, key string, r famReq, opts []locker.Option, wait bool) (*Handle, error) {
	if r.kind == kindPermit && (r.lim < 1 || r.lim > math.MaxInt32) {
		return nil, backend.KeyError(op, key, fmt.Errorf("%w: a semaphore's limit must be within [1, %d], got %d", locker.ErrInvalidOption, math.MaxInt32, r.lim))
	}
	cctx, done, err := l.life.Enter(ctx, op, key)
	if err != nil {
		return nil, err
	}
	defer done()
	ttl, err := l.cfg.lockTTL(opts)
	if err != nil {
		return nil, backend.KeyError(op, key, err)
	}
	drift, err := l.cfg.driftFor(ttl)
	if err != nil {
		return nil, backend.KeyError(op, key, err)
	}
	if err := l.init(cctx); err != nil {
		return nil, backend.KeyError(op, key, l.life.Why(cctx, err))
	}
	if err := l.famInit(cctx); err != nil {
		return nil, backend.KeyError(op, key, l.life.Why(cctx, err))
	}
	var h *Handle
	if wait {
		h, err = l.famAwait(cctx, key, r, ttl, drift)
	} else {
		for n := 0; n < lease.LateTries; n++ {
			if h, err = l.famTry(cctx, key, r, ttl, drift); !lease.IsLate(err) {
				break
			}
		}
		if err == nil && h == nil {
			err = locker.ErrNotAcquired
		}
	}
	return l.keep(cctx, op, key, h, err)
}

// famTry makes one attempt without queueing: the Handle, or nil when the
// key does not admit a new row now.
func (l *Locker) famTry(ctx context.Context, key string, r famReq, ttl, drift time.Duration) (*Handle, error) {
	owner := lease.NewOwner()
	sent := time.Now()
	q, err := l.famEnqueue(ctx, key, r, owner, ttl, false)
	if err != nil {
		if !errors.Is(err, locker.ErrLimitMismatch) { // else rolled back: no row
			l.famCleanup(r.family, key, owner, ttl)
		}
		return nil, err
	}
	if q.token == 0 {
		return nil, nil
	}
	return l.famHandle(ctx, key, r, owner, q.seq, q.token, ttl, drift, sent)
}

// famAwait queues a row for key and waits until it is granted or ctx ends.
//
// A waiter takes the key's head lock only to queue its row and to take a
// grant: when a release names its row as admitted (wakeOwner: in this
// process, or through the PostgreSQL listener), or when its own look at
// the queue finds it admitted. It looks (without the lock: one UPDATE that
// extends its row's wait and one read of its place) when the table's wake
// reaches it as its key's head waiter (the SQLite signal file, a
// listener's reconnect), and otherwise every retry interval (or its
// back-off when nothing wakes it), no later than the first row ahead of it
// runs out, and often enough to keep its own row (waitLease/3). A wait
// that ends without the lock deletes its row (in the background, repeated
// until it is sure).
func (l *Locker) famAwait(ctx context.Context, key string, r famReq, ttl, drift time.Duration) (h *Handle, err error) {
	owner := lease.NewOwner()
	w := procHub.watchOwner(l.hubKey, famID(r.family, key), owner)
	defer procHub.leave(w, false)
	defer func() {
		if h == nil && !errors.Is(err, locker.ErrLimitMismatch) { // a refused limit queued nothing
			l.famCleanup(r.family, key, owner, ttl)
		}
	}()
	back := backoff.New(2*time.Millisecond, l.cfg.RetryInterval)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var q famQueued
	// The listener is started once the row is queued, as the mutex's
	// waiters do: its start may take a round trip or more (a connection
	// of its own), and a row queued later would let later contenders
	// (readers behind a writer) in first. A release made before it
	// listens is not lost: when it is up it wakes every waiter of the
	// table.
	notified, started := false, false
	queued, admitted := false, false
	bellNext := l.bell != nil // wait on the bell next (MySQL), not sleep
	for {
		sent := time.Now()
		switch {
		case !queued:
			q, err = l.famEnqueue(ctx, key, r, owner, ttl, true)
		case admitted:
			q, err = l.famPoll(ctx, key, r, owner, q.seq, ttl)
		default:
			var ok bool
			ok, q, err = l.famLook(ctx, key, r, owner, q.seq, ttl)
			if err == nil && ok {
				sent = time.Now()
				q, err = l.famPoll(ctx, key, r, owner, q.seq, ttl)
			}
		}
		if err != nil {
			return nil, err
		}
		queued = !q.gone
		if q.token != 0 {
			h, err = l.famHandle(ctx, key, r, owner, q.seq, q.token, ttl, drift, sent)
			if lease.IsLate(err) {
				queued = false // its row was given back: queue again
				continue
			}
			return h, err
		}
		if q.gone {
			continue // the row's wait lapsed (or it was deleted): queue again
		}
		if !started {
			started = true
			notified = l.wake.start(ctx)
		}
		limit := min(l.waitLease(ttl)/3, max(q.until, 0)+time.Millisecond)
		admitted = false
		if bellNext && q.watch != 0 && !procHub.holds(l.hubKey, famBellKey(r.family, key, q.watch)) {
			// MySQL: wait for the bell of the row ahead, which its holder
			// (in another process) gives back at its release, as the
			// mutex's waiters do; a wake by name cuts it short.
			rang, ok, woken := l.famBell(ctx, w, famBellKey(r.family, key, q.watch), min(l.cfg.RetryInterval, limit))
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			switch {
			case woken:
				admitted = true
				continue
			case ok:
				// After a ring, one short back-off round before the next
				// bell (the row ahead may have been granted to another);
				// after a bell that did not come, the bell again.
				bellNext = !rang
				if rang {
					back.Reset()
				}
				continue
			}
			// The bell came at once (nobody rings it: a holder of less
			// than 5ms, or a waiting row) or could not be waited for:
			// sleep the back-off.
		}
		bellNext = l.bell != nil
		d := l.cfg.RetryInterval
		if !notified && !l.wake.up() {
			d = back.Next()
		}
		timer.Reset(min(d, limit))
		select {
		case <-w.oc:
			admitted = true
		case <-w.c:
			// The table's wake: whatever was released, wake the rows of
			// this key it admits (this one too, by name).
			l.famReleased(ctx, r.family, key)
		case <-timer.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		notified = l.wake.up()
	}
}

// famBell waits for the bell of a family row (bellKey) until limit, as
// bell.await does, and is cut short by a wake of w by name (woken).
func (l *Locker) famBell(ctx context.Context, w *waiter, bellKey string, limit time.Duration) (rang, ok, woken bool) {
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := make(chan struct{})
	done := make(chan bool, 1)
	go func() {
		select {
		case <-w.oc:
			cancel()
			done <- true
		case <-stop:
			done <- false
		}
	}()
	rang, ok = l.bell.await(bctx, bellKey, limit)
	close(stop)
	woken = <-done
	return rang, ok, woken
}

// famLook extends the wait of owner's row seq and reads its place, without
// the head lock: ok when the rows ahead of it whose lease has not run out
// admit it, or when rows of its key have run out (famPoll deletes them);
// gone when the row is gone (its wait lapsed).
func (l *Locker) famLook(ctx context.Context, key string, r famReq, owner string, seq int64, ttl time.Duration) (ok bool, q famQueued, err error) {
	q.seq = seq
	n, err := l.affectedIdem(ctx, func(ctx context.Context) (sql.Result, error) {
		return l.fps.extend.ExecContext(ctx, l.fst.extend.args(r.family, key, seq, owner, l.waitLease(ttl).Microseconds())...)
	})
	if err != nil {
		return false, q, err
	}
	if n == 0 {
		q.gone = true
		return false, q, nil
	}
	var token, conflicts, live, lim, untilUS, dead int64
	err = l.retryIdem(ctx, func(ctx context.Context) error {
		return l.fps.state.QueryRowContext(ctx, l.fst.state.args(r.family, key, seq, owner)...).Scan(&token, &conflicts, &live, &lim, &untilUS, &dead, &q.watch)
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		q.gone = true
		return false, q, nil
	case err != nil:
		return false, q, err
	}
	q.until = time.Duration(untilUS) * time.Microsecond
	// Admitted once the rows that ran out are gone; and rows that ran out
	// are for a locked poll to delete (and to wake whom they held back),
	// not to be looked at again and again.
	return live < lim || dead > 0, q, nil
}

// famID is the hub ID of key in family: no valid key has a NUL byte, so it
// meets no mutex key.
func famID(family int, key string) string {
	return "\x00" + strconv.Itoa(family) + "\x00" + key
}

// famHandle makes the Handle of a granted row, unless the grant came too
// late or Close has begun (the row is then given back).
func (l *Locker) famHandle(ctx context.Context, key string, r famReq, owner string, seq, token int64, ttl, drift time.Duration, sent time.Time) (*Handle, error) {
	giveBack := func() {
		if _, err := l.famDropOnce(ctx, r.family, key, owner); err != nil {
			l.famCleanup(r.family, key, owner, ttl)
		}
	}
	if late := lease.Late("sqltable", "the database", sent, ttl, drift); late != nil {
		giveBack()
		return nil, late
	}
	fence, err := l.cfg.Token(token)
	if err != nil {
		giveBack()
		return nil, err
	}
	h := &Handle{l: l, key: key, owner: owner, token: token, fence: fence, ttl: ttl, st: backend.NewState(), fam: r.family, seq: seq}
	if !l.life.Hold(h) {
		l.life.Run(func() { l.famDropOnce(l.endCtx, r.family, key, owner) })
		return nil, locker.ErrClosed
	}
	h.start(sent, drift)
	l.bell.schedule(h)
	return h, nil
}

// famQueued is the outcome of queueing or polling a row.
type famQueued struct {
	seq   int64         // the row's place in its key's queue
	token int64         // the grant's token; 0 while it waits (or was not queued)
	until time.Duration // until the first row ahead of it runs out
	gone  bool          // poll: the row is gone (its wait lapsed)
	watch int64         // look: the seq of the row ahead to wait for (its bell), 0 if none
}

// waitLease is the lease of a waiting row of a lock of ttl: the waiter
// extends it at every look, at least three times per lease; a waiter that
// dies or is cut off holds the rows behind it back for at most as long.
// Three retry intervals (at least locker.MinTTL), so that the waiter's
// looks, which come every retry interval at the latest, keep it; never more
// than the lock's own TTL.
func (l *Locker) waitLease(ttl time.Duration) time.Duration {
	return min(ttl, max(3*l.cfg.RetryInterval, locker.MinTTL))
}

// famBellKey names the bell of a family's row (MySQL, bell.go): rung by
// its holder, waited for by the rows behind it.
func famBellKey(family int, key string, seq int64) string {
	return famID(family, key) + "\x00" + strconv.FormatInt(seq, 10)
}

// errLimit is a semaphore asked with another limit than its rows'.
func errLimit(have int64, asked int) error {
	return fmt.Errorf("%w: the key is a semaphore of %d, asked for %d", locker.ErrLimitMismatch, have, asked)
}

// famEnqueue queues a row of owner for key in one transaction: under the
// key's head lock, it deletes the rows whose lease has run out, refuses a
// semaphore limit that differs from the key's rows', and inserts the row,
// granted when the key admits it; when it does not, and wait is false, it
// inserts nothing.
func (l *Locker) famEnqueue(ctx context.Context, key string, r famReq, owner string, ttl time.Duration, wait bool) (q famQueued, err error) {
	var woken []string
	err = l.famTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		q, woken = famQueued{}, nil
		v, err := l.famLock(ctx, tx, r.family, key, ttl)
		if err != nil {
			return err
		}
		var other, conflicts, untilUS, dead, gone int64
		check := func() error {
			return tx.StmtContext(ctx, l.fps.check).QueryRowContext(ctx, l.fst.check.args(r.family, key, r.lim, r.kind)...).Scan(&other, &conflicts, &untilUS, &dead)
		}
		if err := check(); err != nil {
			return err
		}
		if dead > 0 {
			if gone, err = l.famGC(ctx, tx, r.family, key); err != nil {
				return err
			}
			if err := check(); err != nil {
				return err
			}
		}
		if other != 0 {
			return errLimit(other, r.lim)
		}
		q.until = time.Duration(untilUS) * time.Microsecond
		admitted := conflicts < int64(r.lim)
		if admitted || wait {
			q.seq = v
			if admitted {
				q.token = v
			}
			lease := ttl
			if !admitted {
				lease = l.waitLease(ttl)
			}
			if _, err := tx.StmtContext(ctx, l.fps.insert).ExecContext(ctx, l.fst.insert.args(r.family, key, q.seq, owner, r.kind, r.lim, q.token, lease.Microseconds())...); err != nil {
				return err
			}
		}
		if gone > 0 {
			woken, err = l.famAdmitted(ctx, tx, r.family, key)
		}
		return err
	})
	if err == nil {
		l.famWake(woken)
	}
	return q, err
}

// famPoll looks at owner's waiting row seq in one transaction, under the
// key's head lock: it grants it if the key admits it now, else extends its
// wait by ttl. gone reports a row that no longer exists.
func (l *Locker) famPoll(ctx context.Context, key string, r famReq, owner string, seq int64, ttl time.Duration) (q famQueued, err error) {
	var woken []string
	err = l.famTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		q, woken = famQueued{seq: seq}, nil
		v, err := l.famLock(ctx, tx, r.family, key, ttl)
		if err != nil {
			return err
		}
		var token, conflicts, live, lim, untilUS, dead, gone, watch int64
		state := func() error {
			return tx.StmtContext(ctx, l.fps.state).QueryRowContext(ctx, l.fst.state.args(r.family, key, seq, owner)...).Scan(&token, &conflicts, &live, &lim, &untilUS, &dead, &watch)
		}
		err = state()
		if err == nil && dead > 0 {
			if gone, err = l.famGC(ctx, tx, r.family, key); err == nil {
				err = state()
			}
		}
		switch {
		case errors.Is(err, sql.ErrNoRows):
			q.gone, err = true, nil
		case err != nil:
			return err
		case token != 0:
			// Granted by an earlier poll whose outcome this waiter did
			// not learn: it cannot be, as a failed poll ends the wait.
			return fmt.Errorf("sqltable: the waiting row of %q was granted behind its waiter's back", key)
		default:
			q.until = time.Duration(untilUS) * time.Microsecond
			lease := l.waitLease(ttl)
			if conflicts < lim {
				q.token, lease = v, ttl
			}
			if _, err := tx.StmtContext(ctx, l.fps.set).ExecContext(ctx, l.fst.set.args(r.family, key, seq, owner, q.token, lease.Microseconds())...); err != nil {
				return err
			}
		}
		if gone > 0 {
			woken, err = l.famAdmitted(ctx, tx, r.family, key)
		}
		return err
	})
	if err == nil {
		l.famWake(woken)
	}
	return q, err
}

// famLock takes the key's head lock and the next value of its counter.
func (l *Locker) famLock(ctx context.Context, tx *sql.Tx, family int, key string, ttl time.Duration) (v int64, err error) {
	head := tx.StmtContext(ctx, l.fps.head)
	args := l.fst.head.args(family, key)
	if l.dialect == PostgreSQL {
		args = append(args, strconv.FormatInt(ttl.Milliseconds(), 10))
	}
	if l.dialect == MySQL {
		res, err := head.ExecContext(ctx, args...)
		if err != nil {
			return 0, err
		}
		return res.LastInsertId()
	}
	err = head.QueryRowContext(ctx, args...).Scan(&v)
	return v, err
}

// famGC deletes, under the head lock, the key's rows whose lease has run
// out, and reports how many it deleted. Every row that an admission counts
// as gone is deleted in the admission's transaction: a renewal that comes
// late finds no row to extend.
func (l *Locker) famGC(ctx context.Context, tx *sql.Tx, family int, key string) (int64, error) {
	res, err := tx.StmtContext(ctx, l.fps.gc).ExecContext(ctx, l.fst.gc.args(family, key)...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// famAdmitted returns the owners of key's waiting rows that are admitted
// now; on PostgreSQL the statement also notifies them (at commit, when q is
// a transaction).
func (l *Locker) famAdmitted(ctx context.Context, q interface {
	StmtContext(context.Context, *sql.Stmt) *sql.Stmt
}, family int, key string) ([]string, error) {
	var st *sql.Stmt
	if q != nil {
		st = q.StmtContext(ctx, l.fps.wake)
	} else {
		st = l.fps.wake
	}
	rows, err := st.QueryContext(ctx, l.fst.wake.args(family, key)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var owners []string
	for rows.Next() {
		var owner string
		var err error
		if l.dialect == PostgreSQL {
			var notified sql.RawBytes
			err = rows.Scan(&owner, &notified)
		} else {
			err = rows.Scan(&owner)
		}
		if err != nil {
			return nil, err
		}
		owners = append(owners, owner)
	}
	return owners, rows.Err()
}

// famWake wakes the waiters of the admitted rows of owners: those of this
// process at once; on SQLite, those of other processes by the signal file
// (PostgreSQL's were notified by the statement that found them).
func (l *Locker) famWake(owners []string) {
	remote := false
	for _, o := range owners {
		if !procHub.wakeOwner(o) && procHub.signal(o) {
			remote = true
		}
	}
	if remote && l.fw != nil {
		l.fw.Signal()
	}
}

// famTx runs f in a transaction, again after a transient failure (a busy
// database, a deadlock), and after its connection was found gone before
// the commit (the server rolled it back; see retryIdem). A connection
// found gone at the commit leaves the outcome unknown: that error is the
// caller's. PostgreSQL and MySQL run it at READ COMMITTED, whatever the
// server's default: each statement sees what was committed before it, so
// the reads after the head lock see every row queued before.
func (l *Locker) famTx(ctx context.Context, f func(context.Context, *sql.Tx) error) error {
	var opts *sql.TxOptions
	if l.dialect != SQLite {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	atCommit := false // the last run's error came from the commit
	run := func(ctx context.Context) error {
		atCommit = false
		exit, err := l.pins.enter(ctx) // an acquisition's share of the pool (pool.go)
		if err != nil {
			return err
		}
		defer exit()
		tx, err := l.db.BeginTx(ctx, opts)
		if err != nil {
			return err
		}
		if err := f(ctx, tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		err = tx.Commit()
		atCommit = err != nil
		return err
	}
	err := l.retry(ctx, run)
	for tries, limit := 0, 0; err != nil && !atCommit && l.connGone(err) && ctx.Err() == nil; tries++ {
		if tries == 0 {
			limit = l.goneTries()
		}
		if tries >= limit {
			break
		}
		err = l.retry(ctx, run)
	}
	return err
}

// famRelease runs the guarded release of a family Handle: its row deleted
// if it still holds, then the rows it admits woken.
func (l *Locker) famRelease(ctx context.Context, h *Handle) (bool, error) {
	n, err := l.affected(ctx, func(ctx context.Context) (sql.Result, error) {
		return l.fps.release.ExecContext(ctx, l.fst.release.args(h.fam, h.key, h.seq, h.owner, h.token)...)
	})
	if err == nil && n == 1 {
		l.famReleased(ctx, h.fam, h.key)
	}
	return n == 1, err
}

// famReleased wakes the rows of key that a deleted row admits. A failure
// costs their waiters their retry interval at most.
func (l *Locker) famReleased(ctx context.Context, family int, key string) {
	var owners []string
	err := l.retryIdem(ctx, func(ctx context.Context) error {
		var err error
		owners, err = l.famAdmitted(ctx, nil, family, key)
		return err
	})
	if err == nil {
		l.famWake(owners)
	}
}

// famDropOnce deletes owner's row of key, holder or waiter, and wakes the
// rows it admits.
func (l *Locker) famDropOnce(ctx context.Context, family int, key, owner string) (int64, error) {
	exit, err := l.pins.enter(ctx)
	if err != nil {
		return 0, err
	}
	n, err := l.affectedIdem(ctx, func(ctx context.Context) (sql.Result, error) {
		return l.fps.drop.ExecContext(ctx, l.fst.drop.args(family, key, owner)...)
	})
	exit()
	if n > 0 {
		l.famReleased(ctx, family, key)
	}
	return n, err
}

// famCleanup is cleanup (exec.go) for a family row: owner's row deleted in
// the background, repeated on PostgreSQL and MySQL until it is gone or
// min(TTL, 5s) has passed (a statement cut short may still commit on the
// server).
func (l *Locker) famCleanup(family int, key, owner string, ttl time.Duration) bool {
	return l.life.Go(func() {
		ctx, cancel := context.WithTimeout(l.endCtx, min(ttl, cleanupTimeout))
		defer cancel()
		back := backoff.New(10*time.Millisecond, time.Second)
		for {
			n, err := l.famDropOnce(ctx, family, key, owner)
			if n > 0 || (err == nil && l.dialect == SQLite) || l.life.IsClosing() ||
				!backoff.Sleep(ctx, back.Next(), l.life.Closing().Done()) {
				return
			}
		}
	})
}

// famPrepared are the families' statements, prepared once per Locker by
// famInit.
type famPrepared struct {
	head, gc, check, insert, state, extend, set, renew, release, drop, wake *sql.Stmt
}

func (p *famPrepared) all() []**sql.Stmt {
	return []**sql.Stmt{&p.head, &p.gc, &p.check, &p.insert, &p.state, &p.extend, &p.set, &p.renew, &p.release, &p.drop, &p.wake}
}

func (s *famStatements) all() []fstmt {
	return []fstmt{s.head, s.gc, s.check, s.insert, s.state, s.extend, s.set, s.renew, s.release, s.drop, s.wake}
}

func (p *famPrepared) close() error {
	var errs []error
	for _, st := range p.all() {
		if *st != nil {
			errs = append(errs, (*st).Close())
		}
	}
	return errors.Join(errs...)
}

// famInit makes sure the families table exists, once per Locker (after
// init): tables made by a release without lock families get it added,
// unless WithoutDDL, with which a missing families table is an error that
// says what to run. Then it prepares the families' statements.
func (l *Locker) famInit(ctx context.Context) error {
	select {
	case l.initSem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-l.initSem }()
	if l.famInited {
		return nil
	}
	fs := newFamStatements(l.dialect, l.table)
	var v string
	read := func() error {
		return l.retryIdem(ctx, func(ctx context.Context) error {
			return l.db.QueryRowContext(ctx, fs.version).Scan(&v)
		})
	}
	err := read()
	if errors.Is(err, sql.ErrNoRows) && !l.cfg.NoDDL {
		// Tables of a release without lock families: add the families
		// table (the lock table is unchanged).
		if err = l.runDDL(ctx, fs.ddl); err == nil {
			err = read()
		}
	}
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("sqltable: the lock table %s has no families table for semaphores and reader-writer locks (no families_version row in %s_meta): it was made by an earlier release, and WithoutDDL keeps this Locker from adding it (its mutexes work); create it with:\n%s", l.table, l.table, strings.Join(fs.ddl, ";\n"))
	case err != nil:
		return fmt.Errorf("sqltable: read the families table's version from %s_meta: %w", l.table, err)
	}
	if n, err := strconv.Atoi(v); err != nil || n != FamiliesVersion {
		return fmt.Errorf("sqltable: the families table %s%s has version %q; this release uses version %d (a newer release made it, or the meta table was changed)", l.table, famSuffix, v, FamiliesVersion)
	}
	var errs []error
	for i, st := range fs.all() {
		dst := l.fps.all()[i]
		if *dst != nil {
			continue
		}
		err := l.retryIdem(ctx, func(ctx context.Context) error {
			p, err := l.db.PrepareContext(ctx, st.text)
			*dst = p
			return err
		})
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sqltable: prepare the families' statements: %w", err)
	}
	l.fst = fs
	l.famInited = true
	return nil
}
