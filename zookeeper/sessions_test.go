package zookeeper

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// TestSessionForLease: a TTL goes to the session of its lease step; beyond
// the floor or the ceiling the server's grants showed, to that session;
// on New's own session (no servers to dial), every TTL at or above its
// timeout, and a shorter one is refused naming WithServers. No session is
// dialed here: the pool is filled by hand.
func TestSessionForLease(t *testing.T) {
	l := newLocker(newConfig(nil))
	l.life = backend.NewLife[*Handle](nil)
	defer l.life.Close(backend.Closer[*Handle]{})
	primary := newSession(l, 30*time.Second)
	primary.owned = true
	s2 := newSession(l, 2*time.Second)
	s2.owned = true
	l.primary = primary
	l.sessions[30*time.Second], l.sessions[2*time.Second] = primary, s2
	// The server granted the primary 10s (its ceiling), and a session
	// asked for 1s got 2s (its floor), as learnGrant records them.
	l.sessions[10*time.Second] = primary
	l.ceiling, l.floor = 10*time.Second, 2*time.Second
	for ttl, want := range map[time.Duration]*session{
		locker.MaxTTL:           primary, // above the ceiling
		12 * time.Second:        primary,
		10 * time.Second:        primary,
		locker.DefaultTTL:       primary,
		time.Second:             s2, // below the floor
		2 * time.Second:         s2,
		2999 * time.Millisecond: s2, // the 2s step
	} {
		got, err := l.sessionForLocked(ttl)
		if err != nil || got != want {
			t.Errorf("session for TTL %v: %p (%v), want %p", ttl, got, err, want)
		}
	}

	// New's own session of 3s, no servers.
	n := newLocker(newConfig([]Option{WithSessionTimeout(3 * time.Second)}))
	n.life = backend.NewLife[*Handle](nil)
	defer n.life.Close(backend.Closer[*Handle]{})
	yours := newSession(n, 3*time.Second)
	n.primary = yours
	n.sessions[3*time.Second] = yours
	for _, ttl := range []time.Duration{3 * time.Second, 3500 * time.Millisecond, locker.DefaultTTL, locker.MaxTTL} {
		if got, err := n.sessionForLocked(ttl); err != nil || got != yours {
			t.Errorf("New without servers, TTL %v: %p (%v), want your session", ttl, got, err)
		}
	}
	if _, err := n.sessionForLocked(2 * time.Second); !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), "WithServers") {
		t.Errorf("New without servers, TTL 2s below your session's 3s: %v, want ErrInvalidOption naming WithServers", err)
	}
	// With servers, your session still serves the TTLs between its
	// timeout and the next step (3.5s: step 3s, your 3s).
	n.servers = []string{"127.0.0.1:1"}
	if got, err := n.sessionForLocked(3500 * time.Millisecond); err != nil || got != yours {
		t.Errorf("New with servers, TTL 3.5s: %p (%v), want your session", got, err)
	}
}
