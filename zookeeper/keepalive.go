package zookeeper

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker/backend"
)

// Which moment the leader surely heard from the session
//
// In an ensemble the session is the leader's to expire: it expires the
// session one timeout after it last heard of it. A follower does not tell
// the leader of each request it gets: it answers it, and lists the sessions
// it heard from in its answer to the leader's next ping, which comes every
// half tick. A follower that stalls (a pause, a long GC) or loses the leader
// between answering a request and its next ping leaves the leader with an
// older view: the session may expire up to one ping interval of the client
// (a third of the timeout) plus half a tick before one timeout after the
// client's last answered request. That is why an answer alone cannot move
// the lease.
//
// A sync can. The follower passes it on to the leader and answers it once
// the leader has, so a sync sent at m and answered shows the follower was
// still passing things on to the leader after m. It had answered the
// leader's pings until then, each carrying the sessions it heard from since
// the one before, and the leader pings every half tick: a request the
// follower answered half a tick before m was passed on. So the Locker sends
// a sync every keepalivePeriod of the session's timeout, and counts the
// session as heard of by the leader at the send time of the latest sync
// answered at least relayLag before the send time of the latest sync
// answered (relayLag bounds half a tick: the server's minSessionTimeout is
// two ticks unless configured otherwise, so half a tick is at most a
// quarter of any timeout it grants). A session's own connect request
// counts at once: the server answers it only after the leader has checked
// (and so refreshed) the session.
//
// A leader or a standalone server is the one that expires the session and
// refreshes it with every request it gets: there the send time of the
// latest request answered is exact, and no sync is needed. The Locker asks
// the server it is connected to which it is (the four-letter command srvr,
// which ZooKeeper allows by default), once per connection; until it knows
// (also when srvr is refused, or the port speaks only TLS) it counts the
// server as a follower.
//
// In steady state the lease through a follower so starts about relayLag + keepalivePeriod +
// one round trip before the latest sync: a silent server costs the locks
// sooner than one timeout after the last answer (0.45 of a timeout with
// the default drift margin), never later than the leader may expire them.

// keepalivePeriod is the interval between the Locker's syncs, as a
// fraction of the session timeout: timeout / keepaliveDivisor.
const keepaliveDivisor = 10

// relayLag bounds how long a follower keeps a session's request before
// the leader hears of it (half a tick, see above).
func relayLag(timeout time.Duration) time.Duration { return timeout / 4 }

// syncLog keeps the send and answer times of the latest syncs answered, in
// the order they were sent (one is in flight at a time).
type syncLog struct {
	inflight atomic.Bool

	mu   sync.Mutex
	ring [syncLogLen]syncEntry
	n    int // entries kept, up to syncLogLen
	last int // index of the latest
}

// syncLogLen covers well over relayLag + keepalivePeriod at one sync per
// keepalivePeriod.
const syncLogLen = 8

type syncEntry struct{ sent, answered time.Time }

// reset forgets every sync recorded.
func (g *syncLog) reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n = 0
}

func (g *syncLog) add(sent, answered time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.last = (g.last + 1) % syncLogLen
	g.ring[g.last] = syncEntry{sent, answered}
	g.n = min(g.n+1, syncLogLen)
}

// latest is the send time of the latest sync answered; the zero Time if
// none was.
func (g *syncLog) latest() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n == 0 {
		return time.Time{}
	}
	return g.ring[g.last].sent
}

// anchor is the send time of the latest sync answered at least lag before
// the latest sync answered was sent: the leader heard of the session at or
// after it (see above). The zero Time if there is none.
func (g *syncLog) anchor(lag time.Duration) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n == 0 {
		return time.Time{}
	}
	by := g.ring[g.last].sent.Add(-lag)
	for i := range g.n {
		e := g.ring[(g.last-i+syncLogLen)%syncLogLen]
		if !e.answered.After(by) {
			return e.sent
		}
	}
	return time.Time{}
}

// keepalive sends one sync through the session's connection, unless one is
// on its way, and records its answer. It runs on a goroutine of its own
// (the supervisor's tick starts it): a sync waits as long as the server
// does.
func (s *session) keepalive() {
	if s.l.life.IsClosing() || !s.syncs.inflight.CompareAndSwap(false, true) {
		return
	}
	// Not one of the goroutines Close waits for: a sync cannot be called
	// off, and on your connection (New), which Close leaves open, one sent
	// into a cut link waits for go-zookeeper's receive timeout. It ends
	// then, or when the connection closes, or with its answer.
	go func() {
		defer s.syncs.inflight.Store(false)
		sent := time.Now()
		if _, err := s.conn.Sync("/"); err == nil {
			s.syncs.add(sent, time.Now())
		}
	}()
}

// directLocked reports that the server the session was last connected to
// expires the session itself (a leader, or standalone): its answers count
// at once. The role holds for the connection that asked it only (a
// dialed session: by its number on the link, which a disconnect does not
// change, though go-zookeeper moves on to the next address at once; New's
// session: by the address, while connected).
func (s *session) directLocked() bool {
	r := s.role.Load()
	if r == nil || r.mode != zk.ModeLeader && r.mode != zk.ModeStandalone {
		return false
	}
	if s.link != nil {
		lc := s.link.live.Load()
		return lc != nil && lc.serial == r.serial
	}
	return !s.connected || s.conn.Server() == r.addr
}

// serverRole is a server's answer to srvr, for one connection.
type serverRole struct {
	serial uint64 // the connection's number on the link (dialed sessions)
	addr   string // the connection's server (New)
	mode   zk.Mode
}

// learnRoleLocked asks the server of the connection just made whether it
// leads (see above), and records the answer unless the connection has
// changed since. Until then, and if it cannot tell, the server counts as
// a follower. The syncs of earlier connections are forgotten: they would
// anchor the new connection's lease to before it (a session the Locker
// dialed has its connect request; New's falls back to go-zookeeper's
// receive timeout until its syncs tell).
func (s *session) learnRoleLocked(gen uint64) {
	s.role.Store(nil)
	s.syncs.reset()
	addr := s.conn.Server()
	role := serverRole{addr: addr}
	dial, name := addr, addr
	if s.link != nil {
		lc := s.link.live.Load()
		if lc == nil {
			return
		}
		// The address the connection reached: a name that stands for
		// several servers (DNS, a load balancer) may send a new
		// connection to another. TLS checks the name given.
		role.serial, dial = lc.serial, lc.remote
	}
	if dial == "" {
		return
	}
	wait := min(s.timeout/4, 2*time.Second)
	s.l.life.Go(func() {
		m, err := serverMode(s.l.life.Closing(), dial, name, s.link, wait)
		if err != nil {
			s.log().Debug("locker: zookeeper server did not say whether it leads: counted as a follower", slog.String("server", dial), backend.Err(err))
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.gen.Load() != gen {
			return // another connection since
		}
		role.mode = m
		s.role.Store(&role)
		s.log().Debug("locker: zookeeper server role", slog.String("server", dial), slog.String("mode", m.String()))
	})
}

// serverMode asks the server at addr for its mode with the four-letter
// command srvr (over TLS when the link uses it, checking the certificate
// against name), within wait; ctx ending (Close) cuts it short.
func serverMode(ctx context.Context, addr, name string, k *link, wait time.Duration) (zk.Mode, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return zk.ModeUnknown, err
	}
	stop := context.AfterFunc(ctx, func() { _ = raw.Close() })
	defer stop()
	defer raw.Close()
	c := raw
	if k != nil && k.tls != nil {
		if c, err = k.dialTLS(raw, name, wait); err != nil {
			return zk.ModeUnknown, err
		}
	}
	if _, err := c.Write([]byte("srvr")); err != nil {
		return zk.ModeUnknown, err
	}
	b, err := io.ReadAll(io.LimitReader(c, 64<<10))
	if err != nil && len(b) == 0 {
		return zk.ModeUnknown, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Mode: "); ok {
			switch strings.TrimSpace(v) {
			case "leader":
				return zk.ModeLeader, nil
			case "standalone":
				return zk.ModeStandalone, nil
			case "follower":
				return zk.ModeFollower, nil
			}
			return zk.ModeUnknown, fmt.Errorf("srvr: mode %q", strings.TrimSpace(v))
		}
	}
	return zk.ModeUnknown, fmt.Errorf("srvr: no mode in the answer (%d bytes; is srvr in 4lw.commands.whitelist?)", len(b))
}

// leaseFromLocked is the moment the lease of the session's locks is
// counted from: when the server that expires the session surely last heard
// of it (see above). The zero Time if that is not known: New's session on
// a leader (go-zookeeper shows no answer times), or through a follower
// before its syncs tell (the first relayLag and a bit of the session).
func (s *session) leaseFromLocked() time.Time {
	if s.directLocked() {
		if s.link != nil {
			return s.link.heard()
		}
		return time.Time{}
	}
	return s.heardByLeaderLocked()
}

// heardLocked is the send time of the latest request answered (dialed
// sessions: any; New: the Locker's syncs), for the at-risk signal: a
// server silent for half a timeout.
func (s *session) heardLocked() time.Time {
	if s.link != nil {
		return s.link.heard()
	}
	return s.syncs.latest()
}

// heardByLeaderLocked is when the leader surely last heard of the session
// (see above): the anchor of the syncs, or the send time of the connect
// request that made or resumed the session (dialed sessions), whichever is
// later. The zero Time if neither is known.
func (s *session) heardByLeaderLocked() time.Time {
	a := s.syncs.anchor(relayLag(s.timeout))
	if s.link != nil {
		if c := s.link.connected(); c.After(a) {
			a = c
		}
	}
	return a
}
