package postgres

import (
	"context"
	"errors"
	"net"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
)

// errPoolClosed is what a dial returns once the Locker that owns the pool has
// closed its sockets.
var errPoolClosed = errors.New("postgres: the pool's Locker is closed")

// sockets keeps track of the sockets of a pool that a Locker opened
// (locker.Open), so that Close can close the ones still open.
//
// Close needs it because of how pgx ends a connection whose statement was
// interrupted (by a context, or by a socket closed under it): in the
// background, with a cancel request on a new socket and then a wait for the
// server to hang up, each bounded only by 15s. On a dead link both run to
// their bound, and pgxpool.Pool.Close waits for them. Closing the sockets —
// the cancel request's too, which is dialled through the same function —
// ends those waits at once.
type sockets struct {
	mu     sync.Mutex
	closed bool
	open   map[*socket]struct{}
}

func newSockets() *sockets {
	return &sockets{open: map[*socket]struct{}{}}
}

// dialer wraps dial so that every socket it opens is tracked.
func (s *sockets) dialer(dial pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			_ = nc.Close()
			return nil, errPoolClosed
		}
		c := &socket{Conn: nc, s: s}
		s.open[c] = struct{}{}
		return c, nil
	}
}

// closeAll closes every tracked socket, and makes later dials fail.
func (s *sockets) closeAll() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.closed = true
	open := s.open
	s.open = map[*socket]struct{}{}
	s.mu.Unlock()
	for c := range open {
		_ = c.Conn.Close()
	}
}

// socket is a tracked net.Conn; closing it stops tracking it.
type socket struct {
	net.Conn
	s *sockets
}

func (c *socket) Close() error {
	c.s.mu.Lock()
	delete(c.s.open, c)
	c.s.mu.Unlock()
	return c.Conn.Close()
}
