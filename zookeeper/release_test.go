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
