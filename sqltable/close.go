package sqltable

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

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
		l.fw.Leave()
	}
	err := errors.Join(l.ps.close(), l.fps.close(), l.closeQueue())
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
			h.st.End(backend.KeyError("hold", h.key, fmt.Errorf("%w: Close could not release it (%v); it frees at the end of its lease (%w)", locker.ErrLost, err, locker.ErrClosed)))
			errs = append(errs, backend.KeyError("release", h.key, fmt.Errorf("%w (the lock frees at the end of its lease of %v)", err, h.ttl)))
		case ok:
			h.st.End(locker.ErrReleasedByClose)
		default:
			h.st.End(h.lostErr("released by Close, but the lease had already run out or the row was changed outside this Locker"))
		}
		l.bell.unring(h)
	}
	return errors.Join(errs...)
}
