package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
)

// Close releases every lock the Locker holds (their handles end with
// locker.ErrReleasedByClose), ends its waiting Acquires with errors
// wrapping locker.ErrClosed, stops its goroutines, and closes the
// connection if Connect made it (which ends the session, so the server
// deletes whatever node is left). Close is idempotent.
//
// A lock whose node could not be deleted (the server unreachable for
// closeWait) ends with an error wrapping locker.ErrLost and
// locker.ErrClosed, and Close says so: the node ends with the session.
// go-zookeeper's own Close waits up to a second for the server to confirm
// the end of the session, so Close of a Locker cut off from the server
// takes that second.
func (l *Locker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	held := make([]*Handle, 0, len(l.held))
	for h := range l.held {
		held = append(held, h)
	}
	l.held = map[*Handle]struct{}{}
	l.mu.Unlock()
	l.opsCancel() // waiting Acquires end with ErrClosed

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	for _, h := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.state.Ended() {
				return
			}
			h.releasing.Store(true)
			h.stopWatch()
			err := l.call(ctx, func() error { return l.conn.Delete(h.node, -1) }, nil)
			switch {
			case err == nil:
				h.state.End(locker.ErrReleasedByClose)
			case errors.Is(err, zk.ErrNoNode):
				h.state.End(h.lostErr("the lock node was gone when Close released it"))
			default:
				lost := fmt.Errorf("%w: %w: could not delete the lock node: %v", locker.ErrLost, locker.ErrClosed, err)
				if h.state.End(locker.KeyError("close", h.key, lost)) {
					mu.Lock()
					errs = append(errs, locker.KeyError("close", h.key, lost))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	cancel()
	l.ops.Wait()

	if l.owns {
		l.conn.Close()
	}
	l.bgCancel()
	l.bg.Wait()
	if l.events != nil {
		eventReaders.CompareAndDelete(l.events, l) // the supervisor reads it no more
	}
	if l.owns {
		// The connection is closed: every call still running has ended or
		// ends at once.
		l.calls.Wait()
	} else {
		// On the caller's connection, which stays open, a call ends when
		// the server answers or go-zookeeper drops the connection: wait
		// for that, but not longer than closeWait.
		done := make(chan struct{})
		go func() {
			l.calls.Wait()
			close(done)
		}()
		t := time.NewTimer(closeWait)
		select {
		case <-done:
		case <-t.C:
		}
		t.Stop()
	}
	return errors.Join(errs...)
}
