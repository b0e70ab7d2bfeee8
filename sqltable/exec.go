package sqltable

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-locker/locker/internal/backoff"
	"github.com/go-locker/locker/sqltable/internal/drivers"
)

// How the lock's statements run: each under retry (a busy database, a
// deadlock), prepared once per Locker; the acquire, the read of the
// holder's remaining lease, the guarded release and the guarded drop of an
// abandoned row, with the clean-up that repeats that drop in the
// background.

// transient reports errors after which the statement is known not to have
// taken effect and may simply run again, as the dialect's driver package
// tells them: SQLite's busy and locked databases (another connection or
// process writes), deadlocks and lock-wait timeouts, which roll the
// statement back.
func (l *Locker) transient(err error) bool {
	return l.drv.Transient != nil && l.drv.Transient(err)
}

// retry runs f until it succeeds, fails for good, or ctx ends, sleeping a
// little (jittered, growing to 50ms) after each transient failure.
func (l *Locker) retry(ctx context.Context, f func(context.Context) error) error {
	l.pins.check() // a pool shrunk below the pins: they give way (pool.go)
	// Made at the first transient failure: most statements have none.
	var back *backoff.Backoff
	for {
		err := f(ctx)
		if err == nil || !l.transient(err) {
			return err
		}
		if back == nil {
			back = backoff.New(time.Millisecond, 50*time.Millisecond)
		}
		if !back.Wait(ctx) {
			return fmt.Errorf("%w (while the database was busy: %v)", ctx.Err(), err)
		}
	}
}

// prepared are the statements of the lock operations, prepared once per
// Locker (and by database/sql once per connection): one round trip each on
// MySQL instead of a prepare, an execute and a close, and no parsing on
// SQLite.
type prepared struct {
	acquire, renew, release, drop, remaining *sql.Stmt
}

func (p *prepared) prepare(ctx context.Context, l *Locker) error {
	var errs []error
	for _, s := range []struct {
		dst  **sql.Stmt
		text string
	}{
		{&p.acquire, l.st.acquire},
		{&p.renew, l.st.renew},
		{&p.release, l.st.release},
		{&p.drop, l.st.drop},
		{&p.remaining, l.st.remaining},
	} {
		if *s.dst != nil {
			continue
		}
		err := l.retryIdem(ctx, func(ctx context.Context) error {
			st, err := l.db.PrepareContext(ctx, s.text)
			*s.dst = st
			return err
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sqltable: prepare the lock statements: %w", err)
	}
	return nil
}

func (p *prepared) close() error {
	var errs []error
	for _, st := range []*sql.Stmt{p.acquire, p.renew, p.release, p.drop, p.remaining} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(errs...)
}

// runAcquire runs the acquire statement.
// seq is the caller's place in the key's waiter queue (noSeq: none; see
// queue.go).
func (l *Locker) runAcquire(ctx context.Context, key, owner string, ttl time.Duration, seq int64) (token int64, ok bool, err error) {
	args := l.acquireArgs(key, owner, ttl, seq)
	exit, err := l.pins.enter(ctx)
	if err != nil {
		return 0, false, err
	}
	defer exit()
	err = l.retry(ctx, func(ctx context.Context) error {
		if l.dialect == MySQL {
			res, err := l.ps.acquire.ExecContext(ctx, args...)
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
		if l.drv.QueryInt64 != nil && !l.notOwn.Load() {
			var err error
			token, ok, err = l.acquireRaw(ctx, args)
			if !errors.Is(err, drivers.ErrNotOwn) {
				return err
			}
			l.notOwn.Store(true)
		}
		err := l.ps.acquire.QueryRowContext(ctx, args...).Scan(&token)
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
	err := l.retryIdem(ctx, func(ctx context.Context) error {
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
// another (at most goneTries times, while connections are found gone): the guarded statement frees the row only if it is still
// this holder's, so a second run never touches another holder's lock. If
// that run frees the row, the first did not, and the release succeeded;
// if it finds nothing, the first may have freed it before its connection
// went, and the first error stands.
func (l *Locker) release(ctx context.Context, h *Handle) (bool, error) {
	run := func() (bool, error) {
		if h.fam != 0 {
			return l.famRelease(ctx, h)
		}
		if h.dequeued != nil {
			// The holder's waiter row goes first: it would hold back
			// the waiters behind it once the lock is free.
			select {
			case <-h.dequeued:
			case <-ctx.Done():
			}
		}
		// On PostgreSQL the statement is a SELECT of pg_notify over the
		// updated row: its rows affected ("SELECT 1" or "SELECT 0") tell
		// whether the row was freed. Exec, not Query: database/sql starts a
		// goroutine per Rows of a cancellable context, which costs more
		// than the statement on a small machine.
		n, err := l.affected(ctx, func(ctx context.Context) (sql.Result, error) {
			return l.ps.release.ExecContext(ctx, h.key, h.owner, h.token)
		})
		return n == 1, err
	}
	ok, err := run()
	limit := 0
	if err != nil && l.connGone(err) {
		limit = l.goneTries()
	}
	for try := 0; try < limit && err != nil && l.connGone(err) && ctx.Err() == nil; try++ {
		// Each dead connection found is dropped from the pool; the next
		// run gets another, or a new one.
		var err2 error
		switch ok, err2 = run(); {
		case err2 == nil && ok:
			err = nil
		case err2 == nil:
			try = limit // nothing freed: the first error stands
		case !l.connGone(err2):
			try = limit
		}
	}
	if err == nil && ok && h.fam == 0 {
		l.released(h.key, h.owner)
	}
	return ok, err
}

// released wakes the waiters of key, in this process and (SQLite: through
// the file signal) in others, after the lock of owner was freed.
func (l *Locker) released(key, owner string) {
	procHub.wake(l.hubKey, key, owner)
	if l.fw != nil {
		l.fw.Signal()
	}
}

// affected runs exec (an UPDATE or a DELETE) under retry and returns the
// rows it affected.
func (l *Locker) affected(ctx context.Context, exec func(context.Context) (sql.Result, error)) (int64, error) {
	return l.rowsAffected(ctx, l.retry, exec)
}

// rowsAffected runs exec under retry (retry or retryIdem) and returns the
// rows it affected.
func (l *Locker) rowsAffected(ctx context.Context, retry func(context.Context, func(context.Context) error) error, exec func(context.Context) (sql.Result, error)) (int64, error) {
	var n int64
	err := retry(ctx, func(ctx context.Context) error {
		res, err := exec(ctx)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n, err
}

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
	exit, err := l.pins.enter(ctx)
	if err != nil {
		return 0, err
	}
	n, err := l.affectedIdem(ctx, func(ctx context.Context) (sql.Result, error) {
		return l.ps.drop.ExecContext(ctx, key, owner)
	})
	exit()
	if n > 0 {
		l.released(key, owner)
	}
	return n, err
}
