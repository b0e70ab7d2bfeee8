package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// Handle is a held lock: the contender's node is the lowest of its lock
// directory. It is safe for concurrent use.
type Handle struct {
	l     *Locker
	key   string
	node  string
	token int64
	sid   int64 // the session that owns the node
	state *backend.State

	mu        sync.Mutex  // serialises Release
	releasing atomic.Bool // our own delete is on its way: its watch event is no loss
}

var _ locker.Handle = (*Handle)(nil)

func newHandle(l *Locker, key, node string, token, sid int64) *Handle {
	return &Handle{l: l, key: key, node: node, token: token, sid: sid, state: backend.NewState()}
}

// Key returns the key as the caller gave it.
func (h *Handle) Key() string { return h.key }

// Token returns the fencing token: the czxid (the transaction id of its
// creation) of the holder's node. See the package documentation for why it
// increases across holders.
func (h *Handle) Token() int64 { return h.token }

// Done is closed once the lock is released or lost.
func (h *Handle) Done() <-chan struct{} { return h.state.Done() }

// Err is nil while the lock is held, then locker.ErrReleased or an error
// wrapping locker.ErrLost.
func (h *Handle) Err() error { return h.state.Err() }

// Node returns the path of the holder's node, for operators and tests.
func (h *Handle) Node() string { return h.node }

// SessionID returns the id of the session that owns the holder's node.
func (h *Handle) SessionID() int64 { return h.sid }

func (h *Handle) lostErr(why string) error {
	return locker.KeyError("hold", h.key, fmt.Errorf("%w: %s", locker.ErrLost, why))
}

// Release deletes the holder's node (by its own, unique path: never another
// holder's) and so wakes the next waiter. A node already gone (deleted from
// outside, or the session expired) makes it fail with an error wrapping
// locker.ErrLost. When the server cannot be reached before ctx ends, the
// lock is given up all the same: the deletion goes on when the connection
// comes back, and the node ends with the session otherwise.
func (h *Handle) Release(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.state.Err(); err != nil {
		return locker.KeyError("release", h.key, err)
	}
	l := h.l
	h.releasing.Store(true)
	err := l.call(ctx, func() error { return l.conn.Delete(h.node, -1) }, func(err error) {
		if isConnErr(err) && !errors.Is(err, zk.ErrClosing) {
			l.deleteDetached(h.node)
		}
	})
	l.forget(h)
	switch {
	case err == nil:
		h.state.End(locker.ErrReleased)
		return nil
	case errors.Is(err, zk.ErrNoNode):
		h.state.End(h.lostErr("the lock node was gone: deleted on the server, or the session expired"))
		return locker.KeyError("release", h.key, h.state.Err())
	case isConnErr(err) && !errors.Is(err, zk.ErrClosing):
		l.deleteDetached(h.node)
	}
	h.state.End(locker.ErrReleased)
	return locker.KeyError("release", h.key, fmt.Errorf("zookeeper: the server did not confirm the deletion of the lock node (the lock is given up; the node is deleted when the connection comes back, or ends with the session): %w", err))
}

// forget takes h from the Locker's held set.
func (l *Locker) forget(h *Handle) {
	l.mu.Lock()
	delete(l.held, h)
	l.mu.Unlock()
}

// lose ends h with ErrLost for why.
func (h *Handle) lose(why string) {
	h.l.forget(h)
	h.state.End(h.lostErr(why))
}

// monitor watches the holder's own node until the lock ends: its deletion
// by anyone but Release is a loss.
func (h *Handle) monitor(own <-chan zk.Event) {
	l := h.l
	defer l.bg.Done()
	for {
		select {
		case ev := <-own:
			if h.releasing.Load() || h.state.Ended() {
				return
			}
			switch ev.Type {
			case zk.EventNodeDeleted:
				h.lose("the lock node was deleted on the server")
				return
			case zk.EventNotWatching:
				h.lose(fmt.Sprintf("the server stopped watching the lock node: %v", ev.Err))
				return
			}
			// Data or children changed (not by us): watch again.
			var exists bool
			err := l.call(l.bgCtx, func() error {
				var err error
				exists, _, own, err = l.conn.ExistsW(h.node)
				return err
			}, nil)
			switch {
			case errors.Is(err, locker.ErrClosed):
				return
			case err != nil:
				h.lose(fmt.Sprintf("could not watch the lock node: %v", err))
				return
			case !exists:
				h.lose("the lock node was deleted on the server")
				return
			}
		case <-h.state.Done():
			return
		case <-l.bgCtx.Done():
			return
		}
	}
}

// verify checks, after a reconnect in the same session, that the holder's
// node still exists.
func (h *Handle) verify() {
	l := h.l
	defer l.bg.Done()
	var exists bool
	var st *zk.Stat
	err := l.call(l.bgCtx, func() error {
		var err error
		exists, st, err = l.conn.Exists(h.node)
		return err
	}, nil)
	switch {
	case err != nil:
		// Disconnected again, or closing: the session logic decides.
	case !exists:
		h.lose("the lock node was deleted on the server while the connection was down")
	case st.EphemeralOwner != h.sid:
		h.lose("the lock node belongs to another session")
	}
}
