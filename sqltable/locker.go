package sqltable

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/backoff"
	"github.com/go-locker/locker/internal/lease"
)

var _ locker.Locker = (*Locker)(nil)

// Locker takes locks in one lock table of one database. It is safe for
// concurrent use. Make it with New or Open, and Close it when done.
type Locker struct {
	db      *sql.DB
	ownDB   bool // opened from a URL: Close closes db too
	cfg     config
	dialect Dialect
	notPGX  atomic.Bool // PostgreSQL through a driver that is not pgx's: acquire via database/sql
	table   tableName
	st      statements
	hubKey  string // names the table in the process-wide wake-up hub
	listen  *listener
	wake    waker     // the listener, the file signal or the bell; set by New, and by init on SQLite
	fw      *fileWake // SQLite: the database file's signal to other processes; set by init
	bell    *bell     // MySQL: the named locks that wake other processes' waiters; nil if none
	pins    *pinSet   // the connections kept by the listener and the bell (see pool.go)
	pinned  atomic.Int32
	// watching: watchPool runs (while the Locker holds pins).
	watching atomic.Bool

	// life admits the calls, holds the Handles, counts what Close waits
	// for and runs Close.
	life *backend.Life[*Handle]
	// wg ends a Release that claimRelease counted (handle.go).
	wg lifeCalls
	// endCtx ends locker.ReleaseTimeout after Close began (or when it
	// returns): it bounds the releases Close waits for, its own and those
	// of Releases already in flight.
	endCtx  context.Context
	endStop context.CancelFunc

	initSem chan struct{} // one schema check at a time
	inited  bool          // guarded by initSem
	ps      prepared      // set by init
}

// lifeCalls is the count of the Releases in flight that Close waits for:
// claimRelease counts one with Life.Begin, its Release ends it with Done.
type lifeCalls struct{ life *backend.Life[*Handle] }

// Done ends a Release that claimRelease counted.
func (c lifeCalls) Done() { c.life.End() }

// testHookKeep, when set (by tests), runs in acquire between the
// registration of a new Handle and the check that Close has not begun.
var testHookKeep func(*Handle)

// New returns a Locker that keeps its locks in a table of db. The dialect
// is detected from db's driver (pgx's stdlib, go-sql-driver/mysql or
// modernc.org/sqlite) unless WithDialect names it. New does not contact the
// database: the table is created (unless WithoutDDL) and its schema version
// checked by the first call that needs it. The Locker does not close db.
func New(db *sql.DB, opts ...Option) *Locker {
	cfg, cfgErr := newConfig(opts)
	endCtx, endStop := context.WithCancel(context.Background())
	l := &Locker{
		db:      db,
		cfg:     cfg,
		wake:    noWaker{},
		endCtx:  endCtx,
		endStop: endStop,
		initSem: make(chan struct{}, 1),
	}
	if db == nil && cfgErr == nil {
		cfgErr = fmt.Errorf("%w: sqltable: nil *sql.DB", locker.ErrInvalidOption)
	}
	if cfgErr == nil {
		l.dialect = cfg.dialect
		if l.dialect == DialectAuto {
			l.dialect, cfgErr = detectDialect(db)
		}
	}
	if cfgErr == nil {
		l.table, _ = parseTable(cfg.table) // checked by WithTable
		cfgErr = checkTable(l.dialect, l.table)
	}
	l.life = backend.NewLife[*Handle](cfgErr)
	l.wg = lifeCalls{l.life}
	if cfgErr == nil {
		l.st = newStatements(l.dialect, l.table)
		l.hubKey = l.dialect.String() + ":" + fmt.Sprintf("%p", db) + ":" + l.table.String() // refined by init
		if l.dialect == PostgreSQL || l.dialect == MySQL {
			l.pins = joinPins(db)
		}
		l.listen = newListener(l)
		l.bell = newBell(l)
		switch {
		case l.dialect == PostgreSQL:
			l.wake = l.listen
		case l.bell != nil:
			l.wake = l.bell
		} // SQLite: init sets the file signal, once it knows the file
	}
	return l
}

// Dialect returns the SQL dialect the Locker speaks (DialectAuto when New
// could not tell).
func (l *Locker) Dialect() Dialect { return l.dialect }

// TryAcquire makes one attempt to take key. When another holder has it the
// error wraps locker.ErrNotAcquired.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	h, err := l.acquire(ctx, "try-acquire", key, opts, false)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// Acquire takes key, waiting as long as ctx allows while another holder has
// it (see "Waiting" in the package documentation).
func (l *Locker) Acquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	h, err := l.acquire(ctx, "acquire", key, opts, true)
	if err != nil {
		return nil, err
	}
	return h, nil
}

func (l *Locker) acquire(ctx context.Context, op, key string, opts []locker.Option, wait bool) (*Handle, error) {
	cctx, done, err := l.life.Enter(ctx, op, key)
	if err != nil {
		return nil, err
	}
	defer done()
	ttl, err := l.cfg.lockTTL(opts)
	if err != nil {
		return nil, locker.KeyError(op, key, err)
	}
	drift, err := l.cfg.driftFor(ttl)
	if err != nil {
		return nil, locker.KeyError(op, key, err)
	}
	if err := l.init(cctx); err != nil {
		return nil, locker.KeyError(op, key, l.life.Why(cctx, err))
	}
	h, err := l.try(cctx, key, ttl, drift)
	for n := 1; lease.IsLate(err) && !wait && n < lease.LateTries; n++ {
		h, err = l.try(cctx, key, ttl, drift)
	}
	switch {
	case (err != nil && !(wait && lease.IsLate(err))) || h != nil:
	case !wait:
		return nil, locker.KeyError(op, key, locker.ErrNotAcquired)
	default:
		h, err = l.await(cctx, key, ttl, drift)
	}
	return l.keep(cctx, op, key, h, err)
}

// await waits for key until ctx ends, trying again whenever the Locker's
// waker or a release in this process wakes the caller, else after a
// back-off (see "Waiting" in the package documentation). It returns the
// Handle, or the error that ended the wait.
func (l *Locker) await(ctx context.Context, key string, ttl, drift time.Duration) (h *Handle, err error) {
	// Register for wake-ups, then try again before sleeping: a release
	// between the first try and the registration would go unheard.
	w := procHub.watch(l.hubKey, key)
	defer func() { procHub.leave(w, h == nil) }()
	notified := l.wake.start(ctx)
	back := backoff.New(2*time.Millisecond, l.cfg.retryInterval)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	waitNext := true // wait on the waker next (the bell), not sleep
	for {
		h, err = l.try(ctx, key, ttl, drift)
		if lease.IsLate(err) {
			continue // given back; the next try may be quicker
		}
		if err != nil || h != nil {
			return h, err
		}
		w.acted() // the key is held: a wake-up taken so far was acted on
		rem, err := l.remaining(ctx, key)
		if err != nil {
			return nil, err
		}
		if rem <= 0 {
			continue // the lease ran out meanwhile, or the row is gone
		}
		// Wait no later than the holder's lease runs out (the database's
		// clock counts in whole microseconds; a millisecond on top covers
		// the statement's own round trip).
		limit := rem + time.Millisecond
		if waitNext {
			// A waker the waiter waits on itself (the bell) waits as long
			// as the safety net's timer would. After a release that came
			// without the key following (another waiter won it), one
			// short back-off round (the back-off starts again); a wait
			// that did not wait (ok false): the back-off below, which
			// keeps growing.
			rang, ok := l.wake.wait(ctx, w, key, min(l.cfg.retryInterval, limit))
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if ok {
				waitNext = !rang
				if rang {
					back.Reset()
				}
				select {
				case <-w.c: // a release of this process came meanwhile
					w.woken()
				default:
				}
				continue
			}
		}
		// Releases wake us when the waker is up; the timer is the safety
		// net for a lost wake-up and for a holder that dies without
		// releasing.
		d := l.cfg.retryInterval
		if !notified && !l.wake.up() {
			d = back.Next()
		}
		waitNext = true
		timer.Reset(min(d, limit))
		select {
		case <-w.c:
			w.woken()
		case <-timer.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		notified = l.wake.up()
	}
}

// try makes one attempt. It returns the Handle, or nil when another holder
// has key.
func (l *Locker) try(ctx context.Context, key string, ttl, drift time.Duration) (*Handle, error) {
	owner := lease.NewOwner()
	sent := time.Now() // the lease starts no earlier than the statement leaves
	token, ok, err := l.runAcquire(ctx, key, owner, ttl)
	if err != nil {
		// The statement may have taken the key before the call was cut
		// short (ctx ended, the connection broke after sending it): give
		// it back, so that a failed Acquire leaves nothing behind. The
		// drop is guarded by this attempt's owner, which nobody else has.
		l.cleanup(key, owner, ttl)
		return nil, err
	}
	if !ok {
		return nil, nil
	}
	if late := lease.Late("sqltable", "the database", sent, ttl, drift); late != nil {
		// The grant came back too late to be of use: the Handle would be
		// lost at once, or already is. Give it back (guarded by this
		// attempt's owner); Acquire tries again within its ctx.
		if _, err := l.dropOnce(ctx, key, owner); err != nil {
			l.cleanup(key, owner, ttl)
		}
		return nil, late
	}
	h := &Handle{l: l, key: key, owner: owner, token: token, ttl: ttl, st: backend.NewState()}
	if !l.life.Hold(h) {
		// Close has begun and will not release h: free the row now,
		// within Close's bound (Close waits for it).
		l.dropClosing(key, owner)
		return nil, locker.ErrClosed
	}
	h.start(sent, drift)
	l.bell.schedule(h)
	return h, nil
}

// keep is what acquire returns for the outcome of try or await, whose
// context (from Life.Enter) is ctx: h, unless Close began after try held
// it, in which case Close has taken h over (it releases it; nothing here
// does it twice) and the caller gets an error wrapping locker.ErrClosed
// instead of a Handle that is already ending.
func (l *Locker) keep(ctx context.Context, op, key string, h *Handle, err error) (*Handle, error) {
	if err != nil || h == nil {
		return nil, locker.KeyError(op, key, l.life.Why(ctx, err))
	}
	if testHookKeep != nil {
		testHookKeep(h)
	}
	if l.life.Closed() {
		h.stop() // Close may have stopped the lease before try started it
		return nil, locker.KeyError(op, key, locker.ErrClosed)
	}
	return h, nil
}

// dropClosing frees key's row if it still carries owner, on the calling
// goroutine, within Close's bound: for an attempt that took the row just
// as Close began.
func (l *Locker) dropClosing(key, owner string) {
	// Once Close no longer waits, Run runs nothing: the lease ends the row.
	l.life.Run(func() { l.dropOnce(l.endCtx, key, owner) })
}

// runAcquire runs the acquire statement.
func (l *Locker) runAcquire(ctx context.Context, key, owner string, ttl time.Duration) (token int64, ok bool, err error) {
	err = l.retry(ctx, func(ctx context.Context) error {
		if l.dialect == MySQL {
			res, err := l.ps.acquire.ExecContext(ctx, key, owner, ttl.Microseconds())
			if err != nil {
				return err
			}
			n, err := res.RowsAffected()
			if err != nil {
				return err
			}
			// 1: inserted, 2: updated, 0: held (nothing written).
			if ok = n == 1 || n == 2; ok {
				token, err = res.LastInsertId()
			}
			return err
		}
		if l.dialect == PostgreSQL && !l.notPGX.Load() {
			var err error
			token, ok, err = l.acquirePGX(ctx, key, owner, ttl)
			if !errors.Is(err, errNotPGX) {
				return err
			}
			l.notPGX.Store(true)
		}
		err := l.ps.acquire.QueryRowContext(ctx, key, owner, ttl.Microseconds()).Scan(&token)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			ok = false
			return nil
		case err != nil:
			return err
		}
		ok = true
		return nil
	})
	return token, ok, err
}

// remaining reads how long the holder of key still has by the database's
// clock; 0 when the row is gone.
func (l *Locker) remaining(ctx context.Context, key string) (time.Duration, error) {
	var us int64
	err := l.retry(ctx, func(ctx context.Context) error {
		err := l.ps.remaining.QueryRowContext(ctx, key).Scan(&us)
		if errors.Is(err, sql.ErrNoRows) {
			us = 0
			return nil
		}
		return err
	})
	return time.Duration(us) * time.Microsecond, err
}

// release runs the guarded release of h; true when it freed the row. It is
// bounded by ctx only, not by Close, which would otherwise cut a Release
// short that Close no longer releases itself.
//
// A release whose connection was found gone (see connGone) runs again on
// another (at most maxGoneRetries times, while connections are found
// gone): the guarded statement frees the row only if it is still
// this holder's, so a second run never touches another holder's lock. If
// that run frees the row, the first did not, and the release succeeded;
// if it finds nothing, the first may have freed it before its connection
// went, and the first error stands.
func (l *Locker) release(ctx context.Context, h *Handle) (bool, error) {
	var ok bool
	run := func(ctx context.Context) error {
		// On PostgreSQL the statement is a SELECT of pg_notify over the
		// updated row: its rows affected ("SELECT 1" or "SELECT 0") tell
		// whether the row was freed. Exec, not Query: database/sql starts a
		// goroutine per Rows of a cancellable context, which costs more
		// than the statement on a small machine.
		res, err := l.ps.release.ExecContext(ctx, h.key, h.owner, h.token)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		ok = n == 1
		return err
	}
	err := l.retry(ctx, run)
	for try := 0; try < maxGoneRetries && err != nil && connGone(err) && ctx.Err() == nil; try++ {
		// Each dead connection found is dropped from the pool; the next
		// run gets another, or a new one.
		switch err2 := l.retry(ctx, run); {
		case err2 == nil && ok:
			err = nil
		case err2 == nil:
			try = maxGoneRetries // nothing freed: the first error stands
		case !connGone(err2):
			try = maxGoneRetries
		}
	}
	if err == nil && ok {
		procHub.wake(l.hubKey, h.key, h.owner)
		l.fw.signal()
	}
	return ok, err
}

// maxGoneRetries bounds the runs of a release after its connection was
// found gone: a pool's idle connections may all have died.
const maxGoneRetries = 4

// cleanupTimeout bounds the background frees of rows nobody holds any more
// (with the lease, whichever is shorter).
const cleanupTimeout = 5 * time.Second

// cleanup frees key's row if it still carries owner, in the background: the
// clean-up of a statement whose outcome is unknown (an acquire or a release
// cut short, a renewal too late). It reports whether it started.
//
// On PostgreSQL and MySQL a statement cut short by its context may still be
// running on the server (the cancellation is asynchronous; an INSERT
// waiting for a row lock commits when it gets it), so the guarded drop is
// repeated with a growing pause until it frees a row or min(TTL, 5s) has
// passed: an acquire committed after the first drop does not block the key
// for a whole lease. On SQLite a statement is over when its call returns,
// and one drop that runs is enough. A Close that begins meanwhile waits for
// the drop in flight, within its bound (locker.ReleaseTimeout), as it waits
// for releases, so that an acquire abandoned just before Close does not
// leave its row held for a lease; then it stops the repeats.
func (l *Locker) cleanup(key, owner string, ttl time.Duration) bool {
	return l.life.Go(func() {
		ctx, cancel := context.WithTimeout(l.endCtx, min(ttl, cleanupTimeout))
		defer cancel()
		back := backoff.New(10*time.Millisecond, time.Second)
		for {
			n, err := l.dropOnce(ctx, key, owner)
			if n > 0 || (err == nil && l.dialect == SQLite) || l.life.IsClosing() ||
				!backoff.Sleep(ctx, back.Next(), l.life.Closing().Done()) {
				return
			}
		}
	})
}

// dropOnce runs the guarded drop of key's row for owner and wakes a waiter
// of the key when it freed the row.
func (l *Locker) dropOnce(ctx context.Context, key, owner string) (int64, error) {
	var n int64
	err := l.retry(ctx, func(ctx context.Context) error {
		res, err := l.ps.drop.ExecContext(ctx, key, owner)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if n > 0 {
		procHub.wake(l.hubKey, key, owner)
		l.fw.signal()
	}
	return n, err
}

// Prune deletes the rows of keys whose last lease ran out, or that were
// released, more than olderThan ago (at least MinPruneAge) and whose token
// is below the database's clock minus olderThan, so that a table of many
// short-lived keys does not grow without bound, and returns how many it
// deleted. Tokens of a pruned key keep increasing when it is taken again
// (see "Fencing tokens"). Prune never touches a held lock.
//
// It deletes in batches of at most 1000 rows (999 on MySQL), each a
// transaction of its own, and locks only the rows it deletes: PostgreSQL
// locks them as it picks them and skips rows that an acquire has locked;
// MySQL picks them with a read that locks nothing (its DELETE would lock
// every row it scans), in key order from where the last batch ended, then
// deletes them by key, checking the condition again; SQLite writes one
// transaction at a time anyway. Acquisitions go on between the batches.
// On MySQL, a proxy that sends reads to a lagging replica only makes
// Prune pick rows already gone; it deletes what qualifies on the primary,
// and goes through the table once. When ctx ends or a batch fails, it
// returns the rows deleted so far with the error.
func (l *Locker) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	if err := l.life.ConfigError(); err != nil {
		return 0, err
	}
	if olderThan < MinPruneAge {
		return 0, fmt.Errorf("%w: sqltable: Prune of rows older than %v: the least is %v", locker.ErrInvalidOption, olderThan, MinPruneAge)
	}
	// Life.Enter admits calls on a key; Prune has none: it is counted
	// (Begin) and tied to Close (callCtx) as Enter would do.
	if !l.life.Begin() {
		return 0, locker.ErrClosed
	}
	defer l.life.End()
	if ctx.Err() != nil {
		return 0, backend.ContextError(ctx)
	}
	cctx, cancel := l.callCtx(ctx)
	defer cancel()
	if err := l.init(cctx); err != nil {
		return 0, l.life.Why(cctx, err)
	}
	age := olderThan.Microseconds()
	batch := int64(pruneBatch)
	if l.dialect == MySQL {
		batch = pruneBatchMySQL
	}
	var (
		total int64
		after = []byte{} // MySQL: the last key of the last batch
	)
	for {
		var n, found int64
		err := l.retry(cctx, func(ctx context.Context) error {
			if l.dialect == MySQL {
				var err error
				var last []byte
				n, found, last, err = l.pruneMySQL(ctx, age, after, batch)
				if err == nil && last != nil {
					after = last
				}
				return err
			}
			res, err := l.db.ExecContext(ctx, l.st.prune, age, batch)
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			found = n
			return err
		})
		total += n
		if err != nil {
			return total, l.life.Why(cctx, err)
		}
		if found < batch {
			return total, nil
		}
	}
}

// pruneMySQL runs one batch of Prune on MySQL (see statements.pruneKeys),
// on the keys after after: it returns the rows deleted, the candidates
// found and the last of them (nil when none was found).
func (l *Locker) pruneMySQL(ctx context.Context, age int64, after []byte, batch int64) (deleted, found int64, last []byte, err error) {
	rows, err := l.db.QueryContext(ctx, l.st.prune, age, age, after, batch)
	if err != nil {
		return 0, 0, nil, err
	}
	var keys []any
	for rows.Next() {
		var k []byte
		if err := rows.Scan(&k); err != nil {
			rows.Close()
			return 0, 0, nil, err
		}
		keys, last = append(keys, k), k
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return 0, 0, nil, err
	}
	if len(keys) == 0 {
		return 0, 0, nil, nil
	}
	marks := strings.Repeat("?, ", len(keys)-1) + "?"
	res, err := l.db.ExecContext(ctx, fmt.Sprintf(l.st.pruneKeys, marks), append(keys, age, age)...)
	if err != nil {
		return 0, int64(len(keys)), nil, err
	}
	deleted, err = res.RowsAffected()
	return deleted, int64(len(keys)), last, err
}

// pruneBatch is the most rows one statement of Prune deletes;
// pruneBatchMySQL on MySQL, whose IN list stays below MariaDB's
// in_predicate_conversion_threshold (1000), past which it may turn the
// list into a subquery.
const (
	pruneBatch      = 1000
	pruneBatchMySQL = 999
)

// claimRelease claims h for its Release and counts the Release as in
// flight, for Close to wait for (the Release ends it with l.wg.Done); false
// when h was already claimed or ended, or Close has begun: Close took every
// held lock over, and the Release waits for Close's release of h.
func (l *Locker) claimRelease(h *Handle) (ok, counted bool) {
	if !l.life.Begin() {
		return false, false
	}
	if !h.claim() {
		l.life.End()
		return false, false
	}
	return true, true
}

// endCallCtx is ctx, also cancelled when Close's bound
// (locker.ReleaseTimeout after it began) runs out.
func (l *Locker) endCallCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(l.endCtx, cancel)
	return cctx, func() { stop(); cancel() }
}

// unregister forgets h: it was released or lost.
func (l *Locker) unregister(h *Handle) { l.life.Drop(h) }

// run runs f on the calling goroutine while Close counts it as active, for
// the lease keeper (renew.Config.Go): a renewal on its timer's goroutine,
// and a loss declared by Handle.Err, which must have ended the handle when
// it returns. It returns false without running f once Close no longer
// waits.
func (l *Locker) run(f func()) bool { return l.life.Run(f) }

// callCtx is ctx, also cancelled (cause locker.ErrClosed) when Close
// begins, for a call that Life.Enter did not admit; Life.Why tells its
// errors apart.
func (l *Locker) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(l.life.Closing(), func() { cancel(locker.ErrClosed) })
	return cctx, func() { stop(); cancel(context.Canceled) }
}

// Close releases every lock the Locker holds (their Handles report
// locker.ErrReleasedByClose), ends its waiting Acquires and calls in
// progress with locker.ErrClosed, stops its renewals, background clean-ups
// and its listening connection, and closes the *sql.DB when the Locker
// opened it (Open). An Acquire that took its lock as Close began returns
// an error wrapping locker.ErrClosed, and Close releases that lock too. A
// second Close returns nil.
//
// Close is bounded: it waits at most locker.ReleaseTimeout for the release
// of the held locks, then at most locker.ReleaseTimeout for calls and
// goroutines in flight. Releases already in flight on its Handles get
// locker.ReleaseTimeout from the start of Close, as its own do; then their
// statements are cancelled (a lock whose release was cut short frees at
// the end of its lease). What may outlive Close: a statement on a
// connection of a caller's *sql.DB whose driver does not give up when its
// context is cancelled, until the driver does (a *sql.DB that Open made is
// closed, which waits for its statements).
func (l *Locker) Close() error {
	// Releases already in flight and Close's own get locker.ReleaseTimeout
	// from now; then their statements are cancelled.
	bound := time.AfterFunc(locker.ReleaseTimeout, l.endStop)
	defer bound.Stop()
	return l.life.Close(backend.Closer[*Handle]{
		Release:  l.releaseAll,
		Grace:    locker.ReleaseTimeout,
		Shutdown: l.shutdown,
		Wait:     l.ownDB,
	})
}

// shutdown closes what the Locker owns once nothing else of it runs (or
// Close no longer waits).
func (l *Locker) shutdown() error {
	l.endStop() // what is still in flight gives up now
	if l.listen != nil {
		l.listen.close()
	}
	l.bell.close() // frees the bells it still holds
	l.pins.leave()
	l.initSem <- struct{}{} // no init in progress; none starts (closing)
	if l.fw != nil {
		l.fw.leave(l.hubKey, l.cfg.notify)
	}
	err := l.ps.close()
	if l.ownDB && l.db != nil {
		err = errors.Join(err, l.db.Close())
	}
	return err
}

// releaseAll frees held, those Close took over that no Release or loss has
// claimed, each with its own guarded statement.
func (l *Locker) releaseAll(held []*Handle) error {
	held = slices.DeleteFunc(held, func(h *Handle) bool { return !h.claim() })
	for _, h := range held {
		h.stop()
	}
	var errs []error
	for _, h := range held {
		ok, err := l.release(l.endCtx, h)
		switch {
		case err != nil:
			h.st.End(locker.KeyError("hold", h.key, fmt.Errorf("%w: Close could not release it (%v); it frees at the end of its lease (%w)", locker.ErrLost, err, locker.ErrClosed)))
			errs = append(errs, locker.KeyError("release", h.key, fmt.Errorf("%w (the lock frees at the end of its lease of %v)", err, h.ttl)))
		case ok:
			h.st.End(locker.ErrReleasedByClose)
		default:
			h.st.End(h.lostErr("released by Close, but the lease had already run out or the row was changed outside this Locker"))
		}
		l.bell.unring(h)
	}
	return errors.Join(errs...)
}
