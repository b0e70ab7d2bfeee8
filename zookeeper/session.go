package zookeeper

import (
	"context"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
)

// enqueue is the connection's event callback (Connect). It runs on
// go-zookeeper's own goroutine, so it only queues the event for the
// supervisor; it never blocks.
func (l *Locker) enqueue(ev zk.Event) {
	if ev.Type != zk.EventSession {
		return // watch events reach their watchers through go-zookeeper
	}
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
// It returns when Close ends l.bgCtx.
func (l *Locker) supervise(events <-chan zk.Event) {
	defer l.bg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-l.bgCtx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if ev.Type == zk.EventSession {
				l.onSession(ev.State, timer)
			}
		case <-l.kick:
			l.qmu.Lock()
			q := l.queue
			l.queue = nil
			l.qmu.Unlock()
			for _, ev := range q {
				l.onSession(ev.State, timer)
			}
		case <-timer.C:
			l.mu.Lock()
			if !l.connected && !l.deadline.IsZero() && !time.Now().Before(l.deadline) {
				l.loseSessionLocked(l.sessID, fmt.Sprintf("disconnected from ZooKeeper for %v; the server may expire the session (timeout %v) any moment now",
					time.Since(l.discAt).Round(time.Millisecond), l.timeout))
				l.deadline = time.Time{}
				l.broadcastLocked()
			}
			l.mu.Unlock()
		}
		if events != nil {
			// Events nobody read may have been dropped by go-zookeeper:
			// trust the connection's own state.
			if l.conn.State() == zk.StateHasSession {
				l.onSession(zk.StateHasSession, timer)
			}
		}
	}
}

// onSession applies one session state change.
func (l *Locker) onSession(state zk.State, timer *time.Timer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch state {
	case zk.StateHasSession:
		id := l.conn.SessionID()
		if l.connected && id == l.sessID {
			return
		}
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
		}
		timer.Stop()
		l.broadcastLocked()
		if same {
			// Back in the same session: the locks still stand, if their
			// nodes do. go-zookeeper has set the watches again (a node
			// deleted meanwhile fires at once); check anyway.
			for h := range l.held {
				l.bg.Add(1)
				go h.verify()
			}
		}
		for n, sid := range l.orphans {
			if sid == id {
				delete(l.orphans, n)
				l.calls.Add(1)
				go func() {
					defer l.calls.Done()
					if err := l.conn.Delete(n, -1); isConnErr(err) {
						l.mu.Lock()
						if l.sessID == id && !l.closed {
							l.orphans[n] = id
						}
						l.mu.Unlock()
					}
				}()
			}
		}
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
	for h := range l.held {
		if h.sid != sid {
			continue
		}
		delete(l.held, h)
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
		if l.closed && l.opsCtx.Err() != nil {
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
			return 0, 0, ctx.Err()
		case <-l.bgCtx.Done():
			return 0, 0, locker.ErrClosed
		}
	}
}
