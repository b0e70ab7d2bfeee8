package zookeeper

import (
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// link is what the Locker learns from the connection Connect makes, below
// go-zookeeper: when bytes last came from the server, and the session
// timeout the server granted (go-zookeeper does not expose it). It also
// bounds the handshake: go-zookeeper waits up to ten times two thirds of
// the session timeout for the server's answer to a connect request, so a
// reconnect attempt that went into a partition would hold up the next one
// long after the network healed.
type link struct {
	requested time.Duration
	lastRead  atomic.Int64 // unix nanoseconds of the last byte read from any server
	granted   atomic.Int64 // nanoseconds, from the last connect response
	hosts     *hostList
}

func (k *link) dial(network, address string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial(network, address)
	if err != nil {
		return nil, err
	}
	return &linkConn{Conn: c, link: k}, nil
}

// heard returns when bytes last came from a server.
func (k *link) heard() time.Time {
	n := k.lastRead.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// linkConn is one TCP connection of the link. go-zookeeper reads it from
// one goroutine at a time (the handshake, then its receive loop).
type linkConn struct {
	net.Conn
	link *link
	hs   []byte // the first bytes of the connect response, until parsed
	done bool   // connect response parsed
}

func (c *linkConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.link.lastRead.Store(time.Now().UnixNano())
		if !c.done {
			c.hs = append(c.hs, p[:n]...)
			// length(4) protocolVersion(4) timeOut(4) ...
			if len(c.hs) >= 12 {
				ms := int32(binary.BigEndian.Uint32(c.hs[8:12]))
				if ms > 0 {
					c.link.granted.Store(int64(time.Duration(ms) * time.Millisecond))
				}
				c.done, c.hs = true, nil
			}
		}
	}
	return n, err
}

// SetReadDeadline caps the handshake deadline (see link); the receive
// loop's deadlines, two thirds of the session timeout, pass unchanged.
func (c *linkConn) SetReadDeadline(t time.Time) error {
	return c.Conn.SetReadDeadline(c.cap(t))
}

func (c *linkConn) SetWriteDeadline(t time.Time) error {
	return c.Conn.SetWriteDeadline(c.cap(t))
}

func (c *linkConn) cap(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	if limit := time.Now().Add(c.link.requested); t.After(limit) {
		return limit
	}
	return t
}

// hostList is a zk.HostProvider that dials the servers in turn and reports
// a "retry start" (after which go-zookeeper sleeps a second) only once
// every server was tried without success. go-zookeeper's own provider
// reports it at once with a single server, so that every reconnect would
// start with a second of sleep: long enough, with a short session timeout,
// to lose a session that a prompt reconnect would have kept.
type hostList struct {
	mu      sync.Mutex
	servers []string
	next    int
	tries   int
}

func (h *hostList) Init(servers []string) error {
	if len(servers) == 0 {
		return errors.New("zookeeper: no servers")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.servers = append([]string(nil), servers...)
	return nil
}

func (h *hostList) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.servers)
}

func (h *hostList) Next() (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.servers[h.next]
	h.next = (h.next + 1) % len(h.servers)
	h.tries++
	return s, h.tries > len(h.servers)
}

func (h *hostList) Connected() { h.reset() }

// reset starts a new round of tries: after a successful connection, and
// after the server answered that the session expired (it is reachable, so
// the new session should come at once).
func (h *hostList) reset() {
	h.mu.Lock()
	h.tries = 0
	h.mu.Unlock()
}
