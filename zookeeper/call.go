package zookeeper

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// cleanupWait bounds how long an Acquire that gives up (its context ended,
// TryAcquire found the key held) waits for the deletion of its node before
// it returns; the deletion itself goes on until the server answers.
const cleanupWait = 2 * time.Second

// isConnErr reports an error after which a request may or may not have
// been applied: the connection broke before the answer came.
func isConnErr(err error) bool {
	return errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrNoServer) ||
		errors.Is(err, zk.ErrSessionMoved) || errors.Is(err, zk.ErrClosing)
}

// spawn runs f on a goroutine of the Locker's (Life.Go), or on the
// caller's once Close has stopped waiting: for the parallel requests of
// one call, which waits for them.
func (l *Locker) spawn(f func()) {
	if !l.life.Go(f) {
		f()
	}
}

// removeNode deletes a node the Locker gave up (an abandoned wait, a failed
// TryAcquire), waiting at most cleanupWait; the deletion goes on after that
// until the server answers, and is retried after a reconnect in the same
// session. It does not use the caller's context, which may have ended.
func (s *session) removeNode(node string) {
	done := make(chan struct{})
	s.deleteNode(node, done)
	t := time.NewTimer(cleanupWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-s.l.life.Abandoned().Done():
	}
}

// deleteDetached deletes node in the background.
func (s *session) deleteDetached(node string) { s.deleteNode(node, nil) }

// deleteNode deletes node on a detached call and closes done (if not nil)
// when the server answered or the attempt is handed to the next reconnect.
func (s *session) deleteNode(node string, done chan struct{}) {
	s.mu.Lock()
	sid, connected, closing := s.sessID, s.connected, s.l.life.Abandoned().Err() != nil
	if !connected && !closing {
		s.orphans[node] = sid
		s.mu.Unlock()
		if done != nil {
			close(done)
		}
		return
	}
	s.mu.Unlock()
	started := s.l.life.Go(func() {
		err := s.conn.Delete(node, -1)
		if isConnErr(err) && !errors.Is(err, zk.ErrClosing) {
			s.mu.Lock()
			if s.sessID == sid && !s.l.life.IsClosing() {
				s.orphans[node] = sid
			}
			s.mu.Unlock()
		}
		if done != nil {
			close(done)
		}
	})
	if !started && done != nil {
		close(done) // Close is over: the node ends with the session
	}
}

// call runs fn, one go-zookeeper call (which takes no context), on a
// goroutine of the Locker's, and returns its error; or ctx's error, or
// locker.ErrClosed once Close stops waiting (Life.Abandoned), if that
// comes first. An abandoned call keeps running until go-zookeeper answers
// (or its connection closes); then late, if not nil, gets its error.
func (l *Locker) call(ctx context.Context, fn func() error, late func(error)) error {
	var (
		mu        sync.Mutex
		finished  bool
		abandoned bool
		result    error
		done      = make(chan struct{})
	)
	started := l.life.Go(func() {
		err := fn()
		mu.Lock()
		if abandoned {
			mu.Unlock()
			if late != nil {
				late(err)
			}
			return
		}
		finished, result = true, err
		mu.Unlock()
		close(done)
	})
	if !started {
		return locker.ErrClosed // Close is over: fn was not sent
	}
	var err error
	select {
	case <-done:
		return result
	case <-ctx.Done():
		err = backend.ContextError(ctx)
	case <-l.life.Abandoned().Done():
		err = locker.ErrClosed
	}
	mu.Lock()
	defer mu.Unlock()
	if finished {
		return result
	}
	abandoned = true
	return err
}
