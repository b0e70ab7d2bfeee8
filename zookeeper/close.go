package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// closeWait bounds how long Close waits for the deletion of held nodes,
// and then, on a caller's connection (New), for the calls and goroutines
// still in flight.
const closeWait = 3 * time.Second

// Close releases every lock the Locker holds (their handles end with
// locker.ErrReleasedByClose), ends its waiting Acquires with errors
// wrapping locker.ErrClosed, stops its goroutines, and closes the
// connections of the sessions it dialed (which ends them, so the server
// deletes whatever node is left): all of Connect's, New's other than
// yours. Close is idempotent.
//
// Close is bounded: it waits at most closeWait (3s) for the release of the
// held locks, then at most closeWait for calls and goroutines in flight
// (CloseGrace, 250ms, when it owns every connection: it then closes them,
// which ends them all, and waits for that). On a connection the caller
// keeps (New), a go-zookeeper request the server has not answered by then
// may outlive Close, with the goroutine that waits for it, until the
// server answers or go-zookeeper drops the connection.
//
// A lock whose node could not be deleted (the server unreachable for
// closeWait) ends with an error wrapping locker.ErrLost and
// locker.ErrClosed, and Close says so: the node ends with the session.
// go-zookeeper's own Close waits up to a second for the server to confirm
// the end of the session, so Close of a Locker cut off from the server
// takes that second (once: its sessions are closed at the same time).
func (l *Locker) Close() error {
	c := backend.Closer[*Handle]{
		Release: l.releaseAll,
		Grace:   closeWait,
		Shutdown: func() error {
			// Every session: the primary, and those dialed for other
			// leases (closed, as the Locker dialed them; yours, New's
			// primary, is left open).
			l.smu.Lock()
			all := map[*session]bool{}
			if l.primary != nil {
				all[l.primary] = true
			}
			for _, s := range l.sessions {
				all[s] = true
			}
			l.smu.Unlock()
			var wg sync.WaitGroup
			for s := range all {
				wg.Add(1)
				go func() { // go-zookeeper's Close waits up to a second each
					defer wg.Done()
					s.shutdown()
				}()
			}
			wg.Wait()
			if p := l.primary; p != nil && p.events != nil {
				eventReaders.CompareAndDelete(p.events, l) // the supervisor reads it no more
			}
			return nil
		},
	}
	if l.owns {
		// Closing the connection ends every call still running.
		c.Grace, c.Wait = backend.CloseGrace, true
	}
	return l.life.Close(c)
}

// releaseAll deletes the nodes of the locks held when Close began, all at
// once, each within closeWait.
func (l *Locker) releaseAll(held []*Handle) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	for _, h := range held {
		wg.Add(1)
		l.spawn(func() {
			defer wg.Done()
			if err := l.releaseByClose(ctx, h); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// releaseByClose deletes h's node for Close, and returns the error Close
// reports for it.
func (l *Locker) releaseByClose(ctx context.Context, h *Handle) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state.Ended() {
		return nil
	}
	h.releasing.Store(true)
	h.stopWatch()
	err := l.call(ctx, func() error { return h.s.conn.Delete(h.node, -1) }, nil)
	switch {
	case err == nil:
		h.state.End(locker.ErrReleasedByClose)
	case errors.Is(err, zk.ErrNoNode):
		h.state.End(h.lostErr("the lock node was gone when Close released it"))
	default:
		lost := backend.KeyError("close", h.key, fmt.Errorf("%w: %w: could not delete the lock node: %v", locker.ErrLost, locker.ErrClosed, err))
		if h.state.End(lost) {
			return lost
		}
	}
	return nil
}
