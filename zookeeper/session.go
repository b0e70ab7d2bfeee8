package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// enqueue is the connection's event callback (Connect). It runs on
// go-zookeeper's own goroutine, so it only queues the event for the
// supervisor; it never blocks.
func (l *Locker) enqueue(ev zk.Event) {
	if ev.Type != zk.EventSession {
		return // watch events reach their watchers through go-zookeeper
	}
	l.gen.Add(1) // before go-zookeeper re-arms any watch (see connGen)
	if ev.State == zk.StateExpired && l.link != nil {
		// The server is reachable and said so: get the new session now,
		// not after go-zookeeper's one-second pause between rounds.
		l.link.hosts.reset()
	}
	l.qmu.Lock()
	l.queue = append(l.queue, ev)
	l.qmu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// supervise follows the session: it reads events (from events, the
// caller's channel, for New; from the queue that enqueue fills, for
// Connect) and gives every lock of the session up when it may have ended.
// It returns when Close begins.
func (l *Locker) supervise(events <-chan zk.Event) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	// lease checks, while connected, that some request was answered
	// recently enough (Connect only: see checkLease). It is armed when a
	// session is established (onSession), at the timeout the server
	// granted: the one asked for may be far longer.
	lease := time.NewTimer(time.Hour)
	lease.Stop()
	defer lease.Stop()
	for {
		select {
		case <-l.life.Closing().Done():
			return
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if ev.Type == zk.EventSession {
				l.gen.Add(1) // see connGen
			}
			if ev.Type == zk.EventSession && !l.staleEvent(ev.State) {
				l.onSession(ev.State, timer, lease)
			}
		case <-l.kick:
			l.qmu.Lock()
			q := l.queue
			l.queue = nil
			l.qmu.Unlock()
			for _, ev := range q {
				l.onSession(ev.State, timer, lease)
			}
		case <-timer.C:
			l.mu.Lock()
			if !l.connected && !l.deadline.IsZero() {
				if now := time.Now(); now.Before(l.deadline) {
					timer.Reset(l.deadline.Sub(now)) // early: wait on
				} else {
					l.loseSessionLocked(l.sessID, fmt.Sprintf("disconnected from ZooKeeper for %v; the server may expire the session (timeout %v) any moment now",
						time.Since(l.discAt).Round(time.Millisecond), l.timeout))
					l.deadline = time.Time{}
					l.broadcastLocked()
				}
			}
			l.mu.Unlock()
		case <-lease.C:
			l.checkLease(lease)
		}
		if events != nil {
			// Events nobody read may have been dropped by go-zookeeper:
			// trust the connection's own state.
			if l.conn.State() == zk.StateHasSession {
				l.onSession(zk.StateHasSession, timer, lease)
			}
		}
	}
}

// staleEvent reports a session event from the caller's channel (New) that
// the connection has left behind: it says the link is down or coming up,
// but the connection is back, in the session the Locker knows. The channel
// is buffered and the supervisor also follows the connection's own state
// (see supervise), so such an event can be read after the state it
// describes has passed (the Connected of the first connect, read after
// HasSession was seen); applied, it would take the Locker through a
// disconnection that is over. A session that survived a disconnection
// keeps its nodes, so nothing is lost by skipping it.
func (l *Locker) staleEvent(s zk.State) bool {
	if s == zk.StateHasSession || s == zk.StateExpired || l.conn.State() != zk.StateHasSession {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.connected && l.conn.SessionID() == l.sessID
}

// onSession applies one session state change. timer is the supervisor's
// disconnect deadline, lease its lease check.
func (l *Locker) onSession(state zk.State, timer, lease *time.Timer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch state {
	case zk.StateHasSession:
		id := l.conn.SessionID()
		if l.connected && id == l.sessID {
			return
		}
		// A new connection: the shared watches set before it were set
		// again by go-zookeeper, which gives up on that after a server
		// error. Waiters from now on set their own.
		l.clearWatches()
		if l.sessID != 0 && id != l.sessID {
			l.loseSessionLocked(l.sessID, "the session expired: the server deleted the lock nodes")
			for n, sid := range l.orphans {
				if sid != id {
					delete(l.orphans, n)
				}
			}
		}
		same := id == l.sessID
		l.sessID, l.connected, l.deadline, l.lostSess = id, true, time.Time{}, 0
		if l.link != nil {
			if g := time.Duration(l.link.granted.Load()); g > 0 {
				l.timeout = g
			}
			// The connect response just came (the handshake is a request
			// answered, so heard is now about its send time): the next
			// lease check is due when the lease of that answer ends, by
			// the timeout just granted. Left armed as it was, the check
			// would come at a third of the timeout asked for on the first
			// connect, or of an older grant after a reconnect: with a
			// server that grants far less than asked (its
			// maxSessionTimeout), after the session may have expired.
			lease.Reset(l.nextLeaseCheckLocked(time.Now()))
		}
		timer.Stop()
		l.broadcastLocked()
		if same {
			// Back in the same session: the locks still stand, if their
			// nodes do. go-zookeeper has set the watches again (a node
			// deleted meanwhile fires at once); check anyway.
			for _, h := range l.life.Held() {
				l.life.Go(h.verify)
			}
		}
		for g, sid := range l.ghosts {
			if sid != id {
				delete(l.ghosts, g) // its session is gone, and its node with it
			}
		}
		l.sweepLocked(id)
	case zk.StateExpired:
		l.loseSessionLocked(l.sessID, "the session expired: the server deleted the lock nodes")
		l.connected, l.deadline = false, time.Time{}
		timer.Stop()
		l.broadcastLocked()
	default: // Disconnected, Connecting, Connected (no session yet), AuthFailed
		if !l.connected {
			return
		}
		l.connected = false
		now := time.Now()
		l.discAt = now
		// The server expires the session one timeout after it last heard
		// from us. When we last heard from it bounds that from below:
		// exactly, below go-zookeeper (Connect); else by go-zookeeper's
		// receive timeout of two thirds of the session timeout (New).
		heard := now.Add(-l.timeout * 2 / 3)
		if l.link != nil {
			if h := l.link.heard(); !h.IsZero() && h.Before(now) {
				heard = h
			}
		}
		l.deadline = heard.Add(l.timeout - l.cfg.driftMargin(l.timeout))
		timer.Reset(max(l.deadline.Sub(now), 0))
		l.broadcastLocked()
	}
}

// loseSessionLocked ends every held lock of session sid with ErrLost. Their
// nodes, should the session come back after all, are deleted then.
func (l *Locker) loseSessionLocked(sid int64, why string) {
	if sid == 0 {
		return
	}
	l.lostSess = sid
	for _, h := range l.life.Held() {
		if h.sid != sid {
			continue
		}
		l.life.Drop(h)
		if h.state.End(h.lostErr(why)) {
			l.orphans[h.node] = sid
		}
	}
}

func (l *Locker) broadcastLocked() {
	close(l.sessCh)
	l.sessCh = make(chan struct{})
}

// awaitSession waits until the Locker has a live session and returns its id
// and timeout.
func (l *Locker) awaitSession(ctx context.Context) (int64, time.Duration, error) {
	for {
		l.mu.Lock()
		if l.life.IsClosing() {
			l.mu.Unlock()
			return 0, 0, locker.ErrClosed
		}
		if l.connected {
			id, t := l.sessID, l.timeout
			l.mu.Unlock()
			return id, t, nil
		}
		ch := l.sessCh
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, 0, backend.ContextError(ctx)
		case <-l.life.Closing().Done():
			return 0, 0, locker.ErrClosed
		}
	}
}

// sweepLocked deletes, in the background, the nodes of session id that the
// Locker gave up while it could not reach the server (orphans), and looks
// for the nodes of creates whose outcome it never learnt (ghosts).
func (l *Locker) sweepLocked(id int64) {
	if l.life.IsClosing() {
		return
	}
	for n, sid := range l.orphans {
		if sid == id {
			delete(l.orphans, n)
			l.life.Go(func() {
				if err := l.conn.Delete(n, -1); isConnErr(err) {
					l.mu.Lock()
					if l.sessID == id && !l.life.IsClosing() {
						l.orphans[n] = id
					}
					l.mu.Unlock()
				}
			})
		}
	}
	for g, sid := range l.ghosts {
		if sid == id {
			delete(l.ghosts, g)
			l.life.Go(func() { l.sweepGhost(g, id) })
		}
	}
}

// ghost is a create whose answer was lost and that nobody waits for any
// more: the node, if the server applied the create, is the one in dir
// whose name carries guid.
type ghost struct{ dir, guid string }

// dropCreate makes sure the node of a create whose outcome is unknown, sent
// in session sid, does not stay behind once its Acquire gave up: an
// ephemeral node nobody contends with would block the key for as long as
// the session lives. It is looked for (and deleted) now if the session is
// connected, else once it is back; a new session means the node, if any,
// is gone with the old one.
func (l *Locker) dropCreate(dir, guid string, sid int64) {
	if sid == 0 {
		return
	}
	g := ghost{dir, guid}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.life.IsClosing() || sid != l.sessID {
		return
	}
	if !l.connected {
		l.ghosts[g] = sid
		return
	}
	l.life.Go(func() { l.sweepGhost(g, sid) })
}

// sweepGhost lists g's directory for its GUID and deletes the node found.
// If the server cannot be asked, the ghost waits for the session to be
// back (see sweepLocked).
func (l *Locker) sweepGhost(g ghost, sid int64) {
	ctx, cancel := context.WithTimeout(l.life.Abandoned(), cleanupWait)
	defer cancel()
	found, err := l.findOwn(ctx, g.dir, g.guid)
	if err == nil && found != "" {
		err = l.conn.Delete(found, -1)
		if errors.Is(err, zk.ErrNoNode) {
			err = nil
		}
	}
	if err == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sessID == sid && !l.life.IsClosing() {
		l.ghosts[g] = sid
	}
}

// isUnimplemented reports the answer of a server that does not know the
// operation (ZooKeeper's UNIMPLEMENTED, -6), which go-zookeeper has no
// error value for: a server before 3.5.3 asked for a container node.
func isUnimplemented(err error) bool {
	return err != nil && strings.HasSuffix(err.Error(), "unknown error: -6")
}

// leaseStaleLocked reports that no request sent within the last session
// timeout less the drift margin has been answered, on a Connect Locker
// (New has no such view): the server may expire the session any moment,
// even though go-zookeeper still counts the connection as up (watch
// notifications keep coming on a link that drops what the client sends).
func (l *Locker) leaseStaleLocked(now time.Time) bool {
	if l.link == nil {
		return false
	}
	h := l.link.heard()
	return !h.IsZero() && !now.Before(l.leaseEnd(h))
}

// leaseEnd is when the locks of a session last heard of at h are given up.
func (l *Locker) leaseEnd(h time.Time) time.Time {
	return h.Add(l.timeout - l.cfg.driftMargin(l.timeout))
}

// nextLeaseCheckLocked is how long after now the lease check is next due:
// when the lease of the latest answer ends, or in a third of the session
// timeout when nothing was answered yet.
func (l *Locker) nextLeaseCheckLocked(now time.Time) time.Duration {
	if h := l.link.heard(); !h.IsZero() {
		return max(l.leaseEnd(h).Sub(now), 0)
	}
	return l.timeout / 3
}

// checkLease gives the locks of the session up when, while connected, no
// request has been answered for a session timeout less the drift margin:
// go-zookeeper pings every third of the timeout, so that means the server
// has stopped hearing from us (or answering us), and may expire the
// session before it can say so. The check runs again when the deadline of
// the latest answer comes.
func (l *Locker) checkLease(t *time.Timer) {
	l.mu.Lock()
	var nodes []string
	defer func() {
		l.mu.Unlock()
		for _, n := range nodes {
			l.deleteDetached(n)
		}
	}()
	next := l.timeout / 3
	defer func() { t.Reset(next) }()
	if l.life.IsClosing() || !l.connected || l.sessID == 0 {
		return // the disconnect deadline (or nothing) applies
	}
	h := l.link.heard()
	if h.IsZero() {
		return
	}
	now := time.Now()
	if end := l.leaseEnd(h); now.Before(end) {
		next = end.Sub(now)
		return
	}
	why := fmt.Sprintf("no answer from ZooKeeper to any request sent in the last %v, though connected; the server may expire the session (timeout %v) any moment now",
		now.Sub(h).Round(time.Millisecond), l.timeout)
	for _, hd := range l.life.Held() {
		if hd.sid != l.sessID {
			continue
		}
		l.life.Drop(hd)
		if hd.state.End(hd.lostErr(why)) {
			// The session may well be alive: delete the node once the
			// server answers (deleteNode keeps it for the next
			// reconnect if the connection breaks first).
			nodes = append(nodes, hd.node)
		}
	}
}

// expiredBy says why the locks of the current session must count as lost
// at now although the supervisor may not have ended them yet: the
// disconnect deadline or the lease of the last answered request (Connect)
// has passed. "" when neither has.
func (l *Locker) expiredBy(now time.Time) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.connected && !l.deadline.IsZero() && !now.Before(l.deadline) {
		return fmt.Sprintf("disconnected from ZooKeeper for %v; the server may have expired the session (timeout %v)", now.Sub(l.discAt).Round(time.Millisecond), l.timeout)
	}
	if l.leaseStaleLocked(now) {
		return fmt.Sprintf("no answer from ZooKeeper to any request sent in the last %v; the server may have expired the session (timeout %v)", now.Sub(l.link.heard()).Round(time.Millisecond), l.timeout)
	}
	return ""
}
