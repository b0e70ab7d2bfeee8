package zookeeper

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// A Release that runs before the supervisor has given the session's locks
// up, though their deadline has passed (a process paused past the session
// timeout runs its Release first when it resumes), reports the loss: the
// session may have expired and the key gone to another holder.
func TestReleaseAfterDeadlineReportsLoss(t *testing.T) {
	const timeout = 3 * time.Second
	// A connection to nowhere: the node's deletion, sent in the
	// background, waits until Close.
	conn, _, err := zk.Connect([]string{"127.0.0.1:1"}, timeout, zk.WithLogger(quietLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, tc := range []struct {
		name  string
		setup func(s *session)
	}{
		{"disconnected past the deadline", func(s *session) {
			s.connected = false
			s.discAt = time.Now().Add(-timeout)
			s.deadline = time.Now().Add(-time.Millisecond)
		}},
		{"connected, no answer for a session timeout", func(s *session) {
			s.connected = true
			s.link = newLink(timeout, nil)
			s.link.base = time.Now().Add(-time.Minute) // a link made a minute ago
			s.link.heardSince(time.Now().Add(-timeout))
			s.link.live.Store(&liveConn{serial: 1})
			s.role.Store(&serverRole{serial: 1, mode: zk.ModeStandalone})
		}},
		{"through a follower, answers but no sync shows the leader heard for a session timeout", func(s *session) {
			now := time.Now()
			s.connected = true
			s.link = newLink(timeout, nil)
			s.link.base = now.Add(-time.Minute)
			s.link.joinedAt.Store(int64(time.Second)) // connected 59s ago
			s.link.heardSince(now)                    // the follower answers
			s.syncs.add(now.Add(-timeout-time.Second), now.Add(-timeout-time.Second+time.Millisecond))
			s.syncs.add(now.Add(-10*time.Millisecond), now)
			s.link.live.Store(&liveConn{serial: 1})
			s.role.Store(&serverRole{serial: 1, mode: zk.ModeFollower})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLocker(newConfig(nil))
			s := newSession(l, timeout)
			s.conn, s.sessID = conn, 42
			l.primary = s
			l.life = backend.NewLife[*Handle](nil) // no supervisor
			tc.setup(s)
			h := newHandle(s, "k", "/locker/kk/_c_x-lock-0000000001", 7, 42, timeout)
			l.life.Hold(h)
			err := h.Release(context.Background())
			if !errors.Is(err, locker.ErrLost) {
				t.Fatalf("Release after the deadline: %v, want an error wrapping locker.ErrLost", err)
			}
			if !errors.Is(h.Err(), locker.ErrLost) {
				t.Fatalf("Err() = %v, want ErrLost", h.Err())
			}
			_ = l.life.Close(backend.Closer[*Handle]{})
		})
	}
}

// The lease through a follower starts at the latest sync answered at
// least the relay lag before the latest sync was sent.
func TestSyncLogAnchor(t *testing.T) {
	var g syncLog
	if a := g.anchor(time.Second); !a.IsZero() {
		t.Fatalf("empty log: anchor %v, want none", a)
	}
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for i := range 3 * syncLogLen { // wraps the ring
		g.add(at(time.Duration(i)*time.Second), at(time.Duration(i)*time.Second+10*time.Millisecond))
	}
	last := time.Duration(3*syncLogLen-1) * time.Second
	for _, tc := range []struct{ lag, want time.Duration }{
		{0, last - time.Second}, // the latest was answered after it was sent
		{500 * time.Millisecond, last - time.Second},
		{1500 * time.Millisecond, last - 2*time.Second},
		{2 * time.Second, last - 3*time.Second}, // answered 10ms after: not at least 2s before
	} {
		if got := g.anchor(tc.lag); !got.Equal(at(tc.want)) {
			t.Errorf("lag %v: anchor %v, want %v", tc.lag, got.Sub(t0), tc.want)
		}
	}
	if got := g.latest(); !got.Equal(at(last)) {
		t.Errorf("latest %v, want %v", got.Sub(t0), last)
	}
	if a := g.anchor(time.Duration(syncLogLen) * time.Second); !a.IsZero() {
		t.Errorf("lag beyond the kept syncs: anchor %v, want none", a.Sub(t0))
	}
}

// The leader's rule holds for the connection that asked srvr only: on a
// dialed session, by the connection's number on the link, so that a
// disconnect (after which go-zookeeper names the next address at once)
// keeps it and a new connection drops it; on New's, by the address while
// connected.
func TestDirectHoldsForItsConnection(t *testing.T) {
	conn, _, err := zk.Connect([]string{"127.0.0.1:1"}, 3*time.Second, zk.WithLogger(quietLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	s := newSession(newLocker(newConfig(nil)), 3*time.Second)
	s.conn = conn
	s.link = newLink(3*time.Second, nil)
	s.link.live.Store(&liveConn{serial: 1, remote: "127.0.0.1:1"})
	s.role.Store(&serverRole{serial: 1, mode: zk.ModeLeader})
	s.connected = true
	if !s.directLocked() {
		t.Fatal("leader on the live connection: not direct")
	}
	s.connected = false
	if !s.directLocked() {
		t.Fatal("leader, disconnected, no new connection yet: not direct")
	}
	s.link.live.Store(&liveConn{serial: 2, remote: "127.0.0.1:2"})
	if s.directLocked() {
		t.Fatal("a new connection, not asked yet: direct")
	}
	s.role.Store(&serverRole{serial: 2, mode: zk.ModeFollower})
	if s.directLocked() {
		t.Fatal("follower: direct")
	}

	s.link = nil // New
	s.role.Store(&serverRole{addr: "elsewhere:2181", mode: zk.ModeStandalone})
	s.connected = true
	if s.directLocked() {
		t.Fatal("New, connected to another address than the one asked: direct")
	}
	s.connected = false
	if !s.directLocked() {
		t.Fatal("New, disconnected: the last connection's role no longer holds")
	}
}
