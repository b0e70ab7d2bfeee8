package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

var _ locker.AtRisker = (*Handle)(nil)

// AtRisk is locker.AtRisker's: at risk while the Locker's connection to
// ZooKeeper is down (the session may still be alive: its locks stand
// until the server expires it), or, on a connection the Locker dialed,
// has had no answer for half the session timeout (a ping went
// unanswered); cleared once it is back in the same session, or answers
// again. The locks of one session share its risk.
func (h *Handle) AtRisk() (bool, <-chan struct{}) { return h.s.risk.AtRisk() }

// Handle is a held lock: the contender's node is the lowest of its lock
// directory. It is safe for concurrent use.
type Handle struct {
	l     *Locker
	s     *session      // the Locker's session (connection) that owns the node
	lease time.Duration // s's timeout when the lock was taken: see TTL
	key   string
	node  string
	token int64
	sid   int64 // the id of the ZooKeeper session that owns the node
	state *backend.State

	// dup is set when the node's create was retried after a lost answer:
	// a second node with the same GUID may still be applied after the
	// contention's last listing, and would block the key after this lock
	// is released, until the session ends. Release looks for it.
	dup *ghost

	mu         sync.Mutex      // serialises Release
	releasing  atomic.Bool     // our own delete is on its way: its watch event is no loss
	watchTimer *time.Timer     // starts arm, watchDelay after the grant; nil otherwise
	wch        <-chan zk.Event // the routed watch's own channel (New's session: see sweepHeld); under session.hmu
}

var _ locker.Handle = (*Handle)(nil)

func newHandle(s *session, key, node string, token, sid int64, lease time.Duration) *Handle {
	return &Handle{l: s.l, s: s, lease: lease, key: key, node: node, token: token, sid: sid, state: backend.NewState()}
}

// Key returns the key as the caller gave it.
func (h *Handle) Key() string { return h.key }

// Token returns the fencing token: the czxid (the transaction id of its
// creation) of the holder's node, plus the Locker's token base
// (WithTokenBase). See the package documentation for why it increases
// across holders.
func (h *Handle) Token() int64 { return h.token }

// Done is closed once the lock is released or lost.
func (h *Handle) Done() <-chan struct{} { h.checkSession(); return h.state.Done() }

// Err is nil while the lock is held, then locker.ErrReleased or an error
// wrapping locker.ErrLost.
func (h *Handle) Err() error { h.checkSession(); return h.state.Err() }

// checkSession ends the lock as lost now if the session may have expired
// already (see expiredBy) although the supervisor has not said so yet: the
// process was paused past the session timeout, say, and the caller ran
// first when it resumed. Its node is deleted all the same, in case the
// session lives.
func (h *Handle) checkSession() {
	if h.state.Ended() || h.releasing.Load() {
		return
	}
	if why := h.s.expiredBy(time.Now()); why != "" && h.state.End(h.lostErr(why)) {
		h.l.life.Drop(h)
		h.s.deleteDetached(h.node)
	}
}

// Node returns the path of the holder's node, for operators and tests.
func (h *Handle) Node() string { return h.node }

// SessionID returns the id of the session that owns the holder's node.
func (h *Handle) SessionID() int64 { return h.sid }

func (h *Handle) lostErr(why string) error {
	return backend.KeyError("hold", h.key, fmt.Errorf("%w: %s", locker.ErrLost, why))
}

// Release deletes the holder's node (by its own, unique path: never another
// holder's) and so wakes the next waiter. A node already gone (deleted from
// outside, or the session expired) makes it fail with an error wrapping
// locker.ErrLost. A connection that closes with the delete unanswered is
// waited for (within ctx) and the delete sent again, as long as the
// session lives. When the server cannot be reached before ctx ends, the
// lock is given up all the same: the deletion goes on when the connection
// comes back, and the node ends with the session otherwise.
func (h *Handle) Release(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.state.Err(); err != nil {
		return backend.KeyError("release", h.key, err)
	}
	s := h.s
	h.releasing.Store(true)
	h.stopWatch()
	if why := s.expiredBy(time.Now()); why != "" {
		// The session may have expired already, and the key gone to
		// someone else: the supervisor has not said so yet (the process
		// was paused, say, and this ran first when it resumed). The lock
		// was lost, not released; its node is deleted all the same, in
		// case the session lives.
		h.state.End(h.lostErr(why))
		s.l.life.Drop(h)
		s.deleteDetached(h.node)
		return backend.KeyError("release", h.key, h.state.Err())
	}
	del := func() error { return s.conn.Delete(h.node, -1) }
	late := func(err error) {
		if isConnErr(err) && !errors.Is(err, zk.ErrClosing) {
			s.deleteDetached(h.node)
		}
	}
	err := s.l.call(ctx, del, late)
	for isConnErr(err) && !errors.Is(err, zk.ErrClosing) {
		// The connection closed with the delete sent or queued: whether
		// the server deleted the node is unknown. While the session
		// lives its node stays until deleted, so once the connection is
		// back (within ctx) the delete is sent again, and a node gone
		// then was deleted by the first (nothing else removes a live
		// session's node but a delete from outside, and the holder was
		// deleting it anyway). If the session ended meanwhile, the node
		// went with it: the lock is given up below. The wait ends, at
		// the latest, when the session's deadline passes while
		// disconnected and the lock is given up as lost (awaitRetry).
		if !h.awaitRetry(ctx) {
			if lost := h.state.Err(); lost != nil {
				// The session's deadline passed while it waited: the
				// lock was given up as lost (loseSessionLocked), its
				// node to be deleted should the session come back.
				s.l.life.Drop(h)
				return backend.KeyError("release", h.key, lost)
			}
			break
		}
		if err = s.l.call(ctx, del, late); errors.Is(err, zk.ErrNoNode) {
			err = nil
		}
	}
	s.l.life.Drop(h)
	switch {
	case err == nil:
		h.state.End(locker.ErrReleased)
		if h.dup != nil {
			s.dropCreate(h.dup.dir, h.dup.guid, h.sid)
		}
		return nil
	case errors.Is(err, zk.ErrNoNode):
		h.state.End(h.lostErr("the lock node was gone: deleted on the server, or the session expired"))
		return backend.KeyError("release", h.key, h.state.Err())
	case errors.Is(err, zk.ErrSessionExpired):
		// The server says the session is over: it deleted the node, and
		// may have given the key to someone else before this Release.
		h.state.End(h.lostErr("the server answered the release that the session had expired"))
		return backend.KeyError("release", h.key, h.state.Err())
	case isConnErr(err) && !errors.Is(err, zk.ErrClosing):
		s.deleteDetached(h.node)
	}
	h.state.End(locker.ErrReleased)
	return backend.KeyError("release", h.key, fmt.Errorf("zookeeper: the server did not confirm the deletion of the lock node (the lock is given up; the node is deleted when the connection comes back, or ends with the session): %w", err))
}

// awaitRetry waits until the connection of h's session is back, and
// reports whether h's delete may be sent again: false once ctx ends, the
// Locker closes, the session is another one, or h's lock was given up (the
// session's deadline passed while disconnected: see loseSessionLocked),
// which also bounds the wait when ctx has no deadline.
func (h *Handle) awaitRetry(ctx context.Context) bool {
	s := h.s
	for {
		s.mu.Lock()
		connected, sid, ch := s.connected, s.sessID, s.sessCh
		s.mu.Unlock()
		if sid != h.sid || h.state.Ended() {
			return false
		}
		if connected {
			return s.expiredBy(time.Now()) == ""
		}
		select {
		case <-ch:
		case <-h.state.Done():
			return false
		case <-ctx.Done():
			return false
		case <-s.l.life.Closing().Done():
			return false
		case <-s.stop:
			return false
		}
	}
}

// setDup records, for a node whose create was retried, where a duplicate
// of it could appear (see dup). Call it before the Handle is returned.
func (h *Handle) setDup(c createdNode, dir string) {
	if c.retried {
		if n, ok := parseNode(h.node[len(dir)+1:]); ok {
			h.dup = &ghost{dir, n.guid}
		}
	}
}

// stopWatch stops the timer that would start the monitor, if it has not
// fired yet, and the routing of its node's events. Call it once releasing
// is set.
func (h *Handle) stopWatch() {
	if h.watchTimer != nil {
		h.watchTimer.Stop()
	}
	h.s.unroute(h)
}

// lose ends h with ErrLost for why.
func (h *Handle) lose(why string) {
	h.s.unroute(h)
	h.l.life.Drop(h)
	h.state.End(h.lostErr(why))
}

// arm watches the holder's node, and enters it in the session's routing
// table, so that the watch's events reach the session's supervisor
// (onHeldEvent): no goroutine waits for them, so that a held lock costs
// none (a service that holds one lock per entity it works on holds
// thousands). On a session the Locker dialed, the connection's event
// callback routes them; on your connection (New), the supervisor reads
// them from your events channel, which go-zookeeper drops events into when
// it is full, so it also sweeps the watches' own channels (sweepHeld). The
// node is entered before the watch is set, so that no event of the watch
// comes before it; arm returns once the server has answered (it waits
// through a disconnection in the same session). A node already gone, or
// owned by another session, is a loss.
func (h *Handle) arm() {
	s := h.s
	if h.releasing.Load() || h.state.Ended() || s.l.life.IsClosing() {
		return
	}
	s.hmu.Lock()
	s.held[h.node] = h
	h.wch = nil
	s.hmu.Unlock()
	ch, ok := h.watch()
	if !ok || h.releasing.Load() || h.state.Ended() {
		s.unroute(h)
		return
	}
	s.hmu.Lock()
	if s.held[h.node] == h {
		h.wch = ch
	}
	s.hmu.Unlock()
}

// sweepHeld looks at the channel of every routed watch (New's session: see
// arm) for an event its supervisor did not get from the events channel.
func (s *session) sweepHeld() {
	s.hmu.Lock()
	var evs []zk.Event
	for _, h := range s.held {
		if h.wch == nil {
			continue
		}
		select {
		case ev, ok := <-h.wch:
			h.wch = nil
			if ok {
				evs = append(evs, ev)
			}
		default:
		}
	}
	s.hmu.Unlock()
	for _, ev := range evs {
		s.onHeldEvent(ev)
	}
}

// unroute takes h's node out of the session's routing table.
func (s *session) unroute(h *Handle) {
	s.hmu.Lock()
	if s.held[h.node] == h {
		delete(s.held, h.node)
	}
	s.hmu.Unlock()
}

// onHeldEvent is the supervisor's handling of an event of a watch that
// arm set: the node's deletion by anyone but Release, or the end of the
// watch (the session ended or the connection closed), is a loss; a change
// of its data (not by us) is watched again.
func (s *session) onHeldEvent(ev zk.Event) {
	s.hmu.Lock()
	h := s.held[ev.Path]
	s.hmu.Unlock()
	if h == nil {
		return
	}
	if h.releasing.Load() || h.state.Ended() {
		s.unroute(h)
		return
	}
	switch ev.Type {
	case zk.EventNodeDeleted:
		h.lose("the lock node was deleted on the server")
	case zk.EventNotWatching:
		h.lose(fmt.Sprintf("the server stopped watching the lock node: %v", ev.Err))
	default:
		// A watch fires once: set it again, off the supervisor.
		s.l.life.Go(h.arm)
	}
}

// watch sets a watch on the holder's node (GetW: unlike ExistsW it leaves
// no watch behind on a node that is gone) and checks that the node is
// still the holder's. It retries through disconnections in the same
// session; false means the monitor is done: the lock ended (or is lost
// now), or the Locker is closing.
func (h *Handle) watch() (<-chan zk.Event, bool) {
	s := h.s
	ctx, cancel := context.WithCancel(s.l.life.Closing())
	defer cancel()
	stop := context.AfterFunc(doneContext{h.state.Done()}, cancel)
	defer stop()
	for {
		var (
			st *zk.Stat
			ch <-chan zk.Event
		)
		err := s.l.call(ctx, func() error {
			var err error
			_, st, ch, err = s.conn.GetW(h.node)
			return err
		}, nil)
		if h.releasing.Load() || h.state.Ended() || ctx.Err() != nil {
			return nil, false
		}
		switch {
		case err == nil && st.EphemeralOwner != h.sid:
			h.lose("the lock node belongs to another session")
			return nil, false
		case err == nil:
			return ch, true
		case errors.Is(err, zk.ErrNoNode):
			h.lose("the lock node was deleted on the server")
			return nil, false
		case isConnErr(err) && !errors.Is(err, zk.ErrClosing):
			// The session logic decides whether the lock survives the
			// disconnection; if it does, watch again once connected.
			if _, _, err := s.awaitSession(ctx); err != nil {
				return nil, false
			}
		default:
			h.lose(fmt.Sprintf("could not watch the lock node: %v", err))
			return nil, false
		}
	}
}

// doneContext is a context that ends when done is closed, for
// context.AfterFunc.
type doneContext struct{ done <-chan struct{} }

func (doneContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c doneContext) Done() <-chan struct{}     { return c.done }
func (c doneContext) Err() error {
	select {
	case <-c.done:
		return context.Canceled
	default:
		return nil
	}
}
func (doneContext) Value(any) any { return nil }

// verify checks, after a reconnect in the same session, that the holder's
// node still exists.
//
// A Release may run meanwhile (the Handle is among the held ones until its
// deletion is answered): a node that its own Release deleted is no loss.
// (Without that check, TestConformance/Loss/AtRiskThenCleared failed in a
// make test run: the Release that followed the heal ended as lost, "deleted
// on the server while the connection was down".)
func (h *Handle) verify() {
	s := h.s
	if h.releasing.Load() || h.state.Ended() {
		return
	}
	var exists bool
	var st *zk.Stat
	err := s.l.call(s.l.life.Closing(), func() error {
		var err error
		exists, st, err = s.conn.Exists(h.node)
		return err
	}, nil)
	switch {
	case h.releasing.Load() || h.state.Ended():
		// Released (or ended) meanwhile: not this check's to judge.
	case err != nil:
		// Disconnected again, or closing: the session logic decides.
	case !exists:
		h.lose("the lock node was deleted on the server while the connection was down")
	case st.EphemeralOwner != h.sid:
		h.lose("the lock node belongs to another session")
	}
}
