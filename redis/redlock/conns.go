package redlock

import (
	"context"
	"net"
	"sync"
	"syscall"
)

// connSet tracks the network connections of the clients Open makes, so
// that Close ends them all at once. Closing a go-redis client closes its
// pooled connections, but not one still in its handshake (a Pub/Sub
// connection being made to a node that accepts and never answers waits for
// the client's ReadTimeout), and Close, which owns those clients, waits for
// every request.
type connSet struct {
	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
}

func newConnSet() *connSet { return &connSet{conns: map[net.Conn]struct{}{}} }

// dialer wraps dial: every connection it makes is tracked until closed,
// and one made after closeAll is closed at once.
func (s *connSet) dialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			_ = c.Close()
			return nil, net.ErrClosed
		}
		t := &trackedConn{Conn: c, s: s}
		s.conns[t] = struct{}{}
		if _, ok := c.(syscall.Conn); ok {
			// go-redis checks a pooled connection's health through
			// syscall.Conn; keep that working for plain TCP.
			return &trackedSysConn{t}, nil
		}
		return t, nil
	}
}

// closeAll closes every tracked connection, and every later one.
func (s *connSet) closeAll() {
	s.mu.Lock()
	s.closed = true
	conns := s.conns
	s.conns = map[net.Conn]struct{}{}
	s.mu.Unlock()
	for c := range conns {
		_ = c.(*trackedConn).Conn.Close()
	}
}

type trackedConn struct {
	net.Conn
	s    *connSet
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}

// NetConn returns the wrapped connection (as crypto/tls.Conn's does).
func (c *trackedConn) NetConn() net.Conn { return c.Conn }

type trackedSysConn struct{ *trackedConn }

func (c *trackedSysConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}
