package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// enqueue is the event callback of a connection the Locker dialed. It runs on
// go-zookeeper's own goroutine, so it only queues the event for the
// supervisor; it never blocks. It queues the session's events and those of
// the watches on its holders' nodes (see Handle.arm); the watches of
// waiters reach them through go-zookeeper's channels.
func (s *session) enqueue(ev zk.Event) {
	if ev.Type != zk.EventSession {
		s.hmu.Lock()
		_, held := s.held[ev.Path]
		s.hmu.Unlock()
		if !held {
			return
		}
	} else {
		s.gen.Add(1) // before go-zookeeper re-arms any watch (see connGen)
		if ev.State == zk.StateExpired && s.link != nil {
			// The server is reachable and said so: get the new session
			// now, not after go-zookeeper's one-second pause between
			// rounds.
			s.link.hosts.reset()
		}
	}
	s.qmu.Lock()
	s.queue = append(s.queue, ev)
	s.qmu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// heldSweep is how often the supervisor of New's session looks at the
// channels of the holders' watches (see Handle.arm): a deletion whose event
// your events channel dropped is reported within it.
const heldSweep = time.Second

// supervise follows the session: it reads events (from events, your
// channel, for New's own session; from the queue that enqueue fills, for
// a session the Locker dialed) and gives every lock of the session up
// when it may have ended.
// It returns when Close begins or the session is retired.
func (s *session) supervise(events <-chan zk.Event) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	// lease checks, while connected, that the server surely heard of the
	// session recently enough (see checkLease and leaseFromLocked). It is
	// armed when a session is established (onSession), at the timeout the
	// server granted: the one asked for may be far longer.
	lease := time.NewTimer(time.Hour)
	lease.Stop()
	defer lease.Stop()
	// keep paces the syncs that show the leader heard of the session
	// (through a follower: see keepalive.go).
	s.mu.Lock()
	period := s.timeout / keepaliveDivisor
	s.mu.Unlock()
	keep := time.NewTimer(period)
	defer keep.Stop()
	// sweep, on your connection (New), catches the events of the holders'
	// watches that go-zookeeper dropped from your events channel when it
	// was full (see Handle.arm).
	var sweep <-chan time.Time
	if events != nil {
		t := time.NewTicker(heldSweep)
		defer t.Stop()
		sweep = t.C
	}
	for {
		select {
		case <-s.l.life.Closing().Done():
			return
		case <-sweep:
			s.sweepHeld()
			continue
		case <-s.stop:
			return
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if ev.Type != zk.EventSession {
				s.onHeldEvent(ev) // a watch's (see Handle.arm)
				continue
			}
			s.gen.Add(1) // see connGen
			if !s.staleEvent(ev.State) {
				s.onSession(ev.State, timer, lease, keep)
			}
		case <-s.kick:
			s.qmu.Lock()
			q := s.queue
			s.queue = nil
			s.qmu.Unlock()
			for _, ev := range q {
				if ev.Type != zk.EventSession {
					s.onHeldEvent(ev)
					continue
				}
				s.onSession(ev.State, timer, lease, keep)
			}
		case <-timer.C:
			s.mu.Lock()
			if !s.connected && !s.deadline.IsZero() {
				if now := time.Now(); now.Before(s.deadline) {
					timer.Reset(s.deadline.Sub(now)) // early: wait on
				} else {
					s.loseSessionLocked(s.sessID, fmt.Sprintf("disconnected from ZooKeeper for %v; the server may expire the session (timeout %v) any moment now",
						time.Since(s.discAt).Round(time.Millisecond), s.timeout))
					s.deadline = time.Time{}
					s.broadcastLocked()
				}
			}
			s.mu.Unlock()
		case <-lease.C:
			s.checkLease(lease)
		case <-keep.C:
			s.mu.Lock()
			sync := s.connected && !s.directLocked()
			period = s.timeout / keepaliveDivisor
			s.mu.Unlock()
			if sync {
				s.keepalive()
			}
			keep.Reset(period)
		}
		if events != nil {
			// Events nobody read may have been dropped by go-zookeeper:
			// trust the connection's own state.
			if s.conn.State() == zk.StateHasSession {
				s.onSession(zk.StateHasSession, timer, lease, keep)
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
func (s *session) staleEvent(st zk.State) bool {
	if st == zk.StateHasSession || st == zk.StateExpired || s.conn.State() != zk.StateHasSession {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.connected && s.conn.SessionID() == s.sessID
}

// onSession applies one session state change. timer is the supervisor's
// disconnect deadline, lease its lease check, keep the pace of its syncs.
func (s *session) onSession(state zk.State, timer, lease, keep *time.Timer) {
	var granted time.Duration
	defer func() {
		if granted > 0 {
			s.l.learnGrant(s, granted) // after s.mu is released
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	switch state {
	case zk.StateHasSession:
		id := s.conn.SessionID()
		if s.connected && id == s.sessID {
			return
		}
		// A new connection: the shared watches set before it were set
		// again by go-zookeeper, which gives up on that after a server
		// error. Waiters from now on set their own.
		s.clearWatches()
		if s.sessID != 0 && id != s.sessID {
			s.loseSessionLocked(s.sessID, "the session expired: the server deleted the lock nodes")
			for n, sid := range s.orphans {
				if sid != id {
					delete(s.orphans, n)
				}
			}
		}
		s.learnRoleLocked(s.gen.Load())
		s.keepalive() // the first sync of this connection, while its server's role is asked
		same := id == s.sessID
		if s.risk.Set(false) {
			s.log().Info("locker: zookeeper reconnected: locks no longer at risk", slog.Bool("same_session", same), slog.Int64("session", id))
		} else if !same {
			s.log().Info("locker: zookeeper session established", slog.Int64("session", id))
		}
		s.sessID, s.connected, s.deadline, s.lostSess = id, true, time.Time{}, 0
		if s.link != nil {
			if g := time.Duration(s.link.granted.Load()); g > 0 {
				s.timeout, granted = g, g
			}
		}
		// The connect response just came (the handshake is a request
		// answered, so heard is now about its send time): the next
		// lease check is due when the lease of that answer ends, by
		// the timeout just granted. Left armed as it was, the check
		// would come at a third of the timeout asked for on the first
		// connect, or of an older grant after a reconnect: with a
		// server that grants far less than asked (its
		// maxSessionTimeout), after the session may have expired.
		lease.Reset(s.nextLeaseCheckLocked(time.Now()))
		// The syncs' pace, by the timeout just granted too.
		keep.Reset(s.timeout / keepaliveDivisor)
		timer.Stop()
		s.broadcastLocked()
		if same {
			// Back in the same session: the locks still stand, if their
			// nodes do. go-zookeeper has set the watches again (a node
			// deleted meanwhile fires at once); check anyway.
			for _, h := range s.l.life.Held() {
				s.l.life.Go(h.verify)
			}
		}
		for g, sid := range s.ghosts {
			if sid != id {
				delete(s.ghosts, g) // its session is gone, and its node with it
			}
		}
		s.sweepLocked(id)
	case zk.StateExpired:
		s.risk.Set(false)
		s.log().Warn("locker: zookeeper session expired", slog.Int64("session", s.sessID))
		s.loseSessionLocked(s.sessID, "the session expired: the server deleted the lock nodes")
		s.connected, s.deadline = false, time.Time{}
		timer.Stop()
		s.broadcastLocked()
	default: // Disconnected, Connecting, Connected (no session yet), AuthFailed
		if !s.connected {
			return
		}
		s.connected = false
		now := time.Now()
		s.discAt = now
		// The server expires the session one timeout after it last heard
		// of it (see leaseFromLocked): exactly, below go-zookeeper (a
		// session the Locker dialed) or by the Locker's syncs (through a
		// follower); else go-zookeeper's receive timeout of two thirds of
		// the session timeout bounds it (New's own session).
		heard := now.Add(-s.timeout * 2 / 3)
		if h := s.leaseFromLocked(); !h.IsZero() && h.Before(now) {
			heard = h
		}
		s.deadline = heard.Add(s.timeout - s.l.cfg.driftMargin(s.timeout))
		timer.Reset(max(s.deadline.Sub(now), 0))
		s.risk.Set(true)
		s.log().Warn("locker: zookeeper disconnected: the session's locks are at risk", slog.String("state", state.String()),
			slog.Int64("session", s.sessID), slog.Duration("lost_in", max(s.deadline.Sub(now), 0)))
		s.broadcastLocked()
	}
}

// log is the Locker's logger (WithLogger) for the Locker's own events.
func (s *session) log() backend.Log { return backend.Log{L: s.l.cfg.Logger} }

// loseSessionLocked ends every held lock of session sid with ErrLost. Their
// nodes, should the session come back after all, are deleted then.
func (s *session) loseSessionLocked(sid int64, why string) {
	if sid == 0 {
		return
	}
	s.lostSess = sid
	for _, h := range s.l.life.Held() {
		if h.sid != sid {
			continue
		}
		s.l.life.Drop(h)
		if err := h.lostErr(why); h.state.End(err) {
			s.orphans[h.node] = sid
			s.log().Warn("locker: lock lost", backend.LogKey(h.key), backend.Err(err))
		}
	}
}

func (s *session) broadcastLocked() {
	close(s.sessCh)
	s.sessCh = make(chan struct{})
}

// awaitSession waits until the session may carry locks (see setup) and is
// live, and returns its id and timeout.
func (s *session) awaitSession(ctx context.Context) (int64, time.Duration, error) {
	select {
	case <-s.ready:
	case <-ctx.Done():
		return 0, 0, withLinkErr(backend.ContextError(ctx), s.link)
	case <-s.l.life.Closing().Done():
		return 0, 0, locker.ErrClosed
	}
	if s.setupErr != nil {
		return 0, 0, s.setupErr
	}
	id, t, err := s.awaitConnected(ctx)
	if ctx.Err() != nil {
		err = withLinkErr(err, s.link)
	}
	return id, t, err
}

// awaitConnected waits until the session is live and returns its id and
// timeout.
func (s *session) awaitConnected(ctx context.Context) (int64, time.Duration, error) {
	for {
		s.mu.Lock()
		if s.l.life.IsClosing() {
			s.mu.Unlock()
			return 0, 0, locker.ErrClosed
		}
		if s.connected {
			id, t := s.sessID, s.timeout
			s.mu.Unlock()
			return id, t, nil
		}
		ch := s.sessCh
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, 0, backend.ContextError(ctx)
		case <-s.l.life.Closing().Done():
			return 0, 0, locker.ErrClosed
		case <-s.stop:
			return 0, 0, errRetired
		}
	}
}

// errRetired is the error of a wait on a session that was closed while
// idle (none waits on it then) or whose credentials were refused.
var errRetired = errors.New("zookeeper: the session was closed")

// sweepLocked deletes, in the background, the nodes of session id that the
// Locker gave up while it could not reach the server (orphans), and looks
// for the nodes of creates whose outcome it never learnt (ghosts).
func (s *session) sweepLocked(id int64) {
	if s.l.life.IsClosing() {
		return
	}
	for n, sid := range s.orphans {
		if sid == id {
			delete(s.orphans, n)
			s.l.life.Go(func() {
				if err := s.conn.Delete(n, -1); isConnErr(err) {
					s.mu.Lock()
					if s.sessID == id && !s.l.life.IsClosing() {
						s.orphans[n] = id
					}
					s.mu.Unlock()
				}
			})
		}
	}
	for g, sid := range s.ghosts {
		if sid == id {
			delete(s.ghosts, g)
			s.l.life.Go(func() { s.sweepGhost(g, id) })
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
func (s *session) dropCreate(dir, guid string, sid int64) {
	if sid == 0 {
		return
	}
	g := ghost{dir, guid}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.l.life.IsClosing() || sid != s.sessID {
		return
	}
	if !s.connected {
		s.ghosts[g] = sid
		return
	}
	s.l.life.Go(func() { s.sweepGhost(g, sid) })
}

// sweepGhost lists g's directory for its GUID and deletes the node found.
// If the server cannot be asked, the ghost waits for the session to be
// back (see sweepLocked).
func (s *session) sweepGhost(g ghost, sid int64) {
	ctx, cancel := context.WithTimeout(s.l.life.Abandoned(), cleanupWait)
	defer cancel()
	found, err := s.findOwn(ctx, g.dir, g.guid)
	if err == nil && found != "" {
		err = s.conn.Delete(found, -1)
		if errors.Is(err, zk.ErrNoNode) {
			err = nil
		}
	}
	if err == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessID == sid && !s.l.life.IsClosing() {
		s.ghosts[g] = sid
	}
}

// isUnimplemented reports the answer of a server that does not know the
// operation (ZooKeeper's UNIMPLEMENTED, -6), which go-zookeeper has no
// error value for: a server before 3.5.3 asked for a container node.
func isUnimplemented(err error) bool {
	return err != nil && strings.HasSuffix(err.Error(), "unknown error: -6")
}

// leaseStaleLocked reports that the server surely heard of the session
// (leaseFromLocked) no later than a session timeout less the drift margin
// ago: it may expire the session any moment, even though go-zookeeper
// still counts the connection as up (watch notifications keep coming on a
// link that drops what the client sends). False when that moment is not
// known (New's session on a leader, or early on each connection).
func (s *session) leaseStaleLocked(now time.Time) bool {
	h := s.leaseFromLocked()
	return !h.IsZero() && !now.Before(s.leaseEnd(h))
}

// leaseEnd is when the locks of a session last heard of at h are given up.
func (s *session) leaseEnd(h time.Time) time.Time {
	return h.Add(s.timeout - s.l.cfg.driftMargin(s.timeout))
}

// nextLeaseCheckLocked is how long after now the lease check is next due:
// when the lease ends or the server has been quiet for half a timeout,
// whichever comes first, and at most a tenth of the timeout away.
func (s *session) nextLeaseCheckLocked(now time.Time) time.Duration {
	next := s.timeout / keepaliveDivisor
	if h := s.leaseFromLocked(); !h.IsZero() {
		next = max(s.leaseEnd(h).Sub(now), 0)
	}
	if h := s.heardLocked(); !h.IsZero() {
		next = min(next, max(s.quietEnd(h).Sub(now), 0))
	}
	return next
}

// quietEnd is when a connected session that last heard from the server at
// h is at risk: half a session timeout later. go-zookeeper pings every
// third of the timeout, so by then a ping has gone unanswered: a
// partition, or a stalled server. go-zookeeper itself declares the
// connection down only at two thirds of the timeout, which leaves a
// holder little time to act, and a healed link little time to return.
func (s *session) quietEnd(h time.Time) time.Time { return h.Add(s.timeout / 2) }

// checkLease gives the locks of the session up when, while connected, no
// request has been answered for a session timeout less the drift margin:
// go-zookeeper pings every third of the timeout, so that means the server
// has stopped hearing from us (or answering us), and may expire the
// session before it can say so. The check runs again when the deadline of
// the latest answer comes.
func (s *session) checkLease(t *time.Timer) {
	s.mu.Lock()
	var nodes []string
	defer func() {
		s.mu.Unlock()
		for _, n := range nodes {
			s.deleteDetached(n)
		}
	}()
	next := s.timeout / keepaliveDivisor
	defer func() { t.Reset(next) }()
	if s.l.life.IsClosing() || !s.connected || s.sessID == 0 {
		return // the disconnect deadline (or nothing) applies
	}
	now := time.Now()
	quiet := false
	if h := s.heardLocked(); !h.IsZero() {
		quiet = !now.Before(s.quietEnd(h))
		switch {
		case quiet && s.risk.Set(true):
			s.log().Warn("locker: zookeeper silent: the session's locks are at risk", slog.Int64("session", s.sessID),
				slog.Duration("silent_for", now.Sub(h).Round(time.Millisecond)))
		case !quiet && s.risk.Set(false):
			s.log().Info("locker: zookeeper answering again: locks no longer at risk", slog.Int64("session", s.sessID))
		}
		if !quiet {
			next = min(next, s.quietEnd(h).Sub(now))
		}
	}
	from := s.leaseFromLocked()
	if from.IsZero() {
		return
	}
	if end := s.leaseEnd(from); now.Before(end) {
		next = min(next, end.Sub(now))
		return
	}
	why := fmt.Sprintf("no answer from ZooKeeper, though connected, that shows the server heard of the session in the last %v; it may expire the session (timeout %v) any moment now",
		now.Sub(from).Round(time.Millisecond), s.timeout)
	for _, hd := range s.l.life.Held() {
		if hd.sid != s.sessID {
			continue
		}
		s.l.life.Drop(hd)
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
// disconnect deadline or the lease of the last answered request (dialed)
// has passed. "" when neither has.
func (s *session) expiredBy(now time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.connected && !s.deadline.IsZero() && !now.Before(s.deadline) {
		return fmt.Sprintf("disconnected from ZooKeeper for %v; the server may have expired the session (timeout %v)", now.Sub(s.discAt).Round(time.Millisecond), s.timeout)
	}
	if s.leaseStaleLocked(now) {
		return fmt.Sprintf("no answer from ZooKeeper that shows the server heard of the session in the last %v; it may have expired the session (timeout %v)", now.Sub(s.leaseFromLocked()).Round(time.Millisecond), s.timeout)
	}
	return ""
}
