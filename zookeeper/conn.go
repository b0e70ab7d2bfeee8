package zookeeper

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// link is what the Locker learns from the connection Connect makes, below
// go-zookeeper: when the server last heard from it for sure, and the
// session timeout the server granted (go-zookeeper exposes neither). It
// also bounds the handshake: go-zookeeper waits up to ten times two thirds
// of the session timeout for the server's answer to a connect request, so a
// reconnect attempt that went into a partition would hold up the next one
// long after the network healed.
//
// "Heard for sure" is the send time of the latest request (a ping, an
// operation, the connect request) whose reply has come: the server got the
// request, so it heard from the client at or after that moment, and the
// session cannot expire earlier than one timeout after it. A byte read
// from the server proves nothing of the kind: watch notifications keep
// arriving on a link that drops everything the client sends, and a reply
// can be read long after its request. Replies come in the order of their
// requests (ZooKeeper answers a session's requests in order, pings
// included), so each one is matched to its request by xid in a FIFO.
//
// Times are kept as offsets from base, a reading of the monotonic clock,
// so that a step of the wall clock cannot move the deadline computed from
// them.
type link struct {
	requested time.Duration
	base      time.Time                // monotonic reference of heardAt
	heardAt   atomic.Int64             // nanoseconds after base; 0: never
	granted   atomic.Int64             // nanoseconds, from the last connect response
	joinedAt  atomic.Int64             // like heardAt: send time of the last connect request granted
	serials   atomic.Uint64            // numbers the link's connections
	live      atomic.Pointer[liveConn] // the connection of the last connect request granted
	hosts     *hostList
	tls       *tls.Config // WithTLS; nil: plain TCP
	diag      linkDiag    // why the latest connection attempt failed
}

func newLink(requested time.Duration, tlsCfg *tls.Config) *link {
	return &link{requested: requested, base: time.Now(), hosts: &hostList{}, tls: tlsCfg}
}

func (k *link) dial(network, address string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial(network, address)
	if err == nil && k.tls != nil {
		c, err = k.dialTLS(c, address, timeout)
	}
	if err != nil {
		k.diag.set(err)
		return nil, err
	}
	return &linkConn{Conn: c, link: k, serial: k.serials.Add(1)}, nil
}

// liveConn names the connection whose connect request the server granted
// last: its number on the link and the address it reached (an IP, where
// the name given may stand for several servers).
type liveConn struct {
	serial uint64
	remote string
}

// heard returns the send time of the latest request answered (see link),
// with a monotonic clock reading; the zero Time if none was.
func (k *link) heard() time.Time {
	n := k.heardAt.Load()
	if n == 0 {
		return time.Time{}
	}
	return k.base.Add(time.Duration(n))
}

// connected returns the send time of the latest connect request the server
// granted (a session made, or resumed), with a monotonic clock reading; the
// zero Time if none was.
func (k *link) connected() time.Time {
	n := k.joinedAt.Load()
	if n == 0 {
		return time.Time{}
	}
	return k.base.Add(time.Duration(n))
}

// heardSince records that the server got a request sent at t.
func (k *link) heardSince(t time.Time) {
	n := int64(t.Sub(k.base))
	if n <= 0 {
		n = 1
	}
	for {
		old := k.heardAt.Load()
		if old >= n || k.heardAt.CompareAndSwap(old, n) {
			return
		}
	}
}

// xidNotification is the xid of a watch event, which answers no request.
const xidNotification = -1

// linkConn is one TCP connection of the link. go-zookeeper writes it from
// one goroutine at a time (the handshake, then its send loop) and reads it
// from one goroutine at a time (the handshake, then its receive loop).
type linkConn struct {
	net.Conn
	link   *link
	serial uint64      // see link.serials
	hs     atomic.Bool // the connect response has been parsed

	wmu     sync.Mutex
	wf      framer
	hsSent  time.Time // when the connect request went out
	pending []sent    // requests sent and not yet answered, in order

	rf framer
}

// sent is one request on its way: its xid and when its first byte was
// written.
type sent struct {
	xid int32
	at  time.Time
}

func (c *linkConn) Write(p []byte) (int, error) {
	now := time.Now()
	c.wmu.Lock()
	c.wf.feed(p, func(frame int, head []byte) {
		if frame == 0 {
			c.hsSent = now // the connect request
			return
		}
		if len(head) >= 4 {
			c.pending = append(c.pending, sent{xid: int32(binary.BigEndian.Uint32(head)), at: now})
		}
	})
	c.wmu.Unlock()
	return c.Conn.Write(p)
}

func (c *linkConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.rf.feed(p[:n], c.received)
	}
	if err != nil && remoteAlert(err) {
		c.link.diag.set(err)
	}
	return n, err
}

// received handles the head of each packet read: the connect response
// (protocolVersion, timeOut, ...) or a reply (xid, zxid, err).
func (c *linkConn) received(frame int, head []byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if frame == 0 {
		if len(head) >= 8 {
			if ms := int32(binary.BigEndian.Uint32(head[4:8])); ms > 0 {
				c.link.granted.Store(int64(time.Duration(ms) * time.Millisecond))
				if !c.hsSent.IsZero() {
					// Granted: the leader made or refreshed the session.
					c.link.joinedAt.Store(max(int64(c.hsSent.Sub(c.link.base)), 1))
				}
				c.link.live.Store(&liveConn{c.serial, c.RemoteAddr().String()})
			}
		}
		if !c.hsSent.IsZero() {
			c.link.heardSince(c.hsSent)
		}
		c.hs.Store(true)
		c.link.diag.set(nil)
		return
	}
	if len(head) < 4 {
		return
	}
	xid := int32(binary.BigEndian.Uint32(head))
	if xid == xidNotification {
		return
	}
	for i, r := range c.pending {
		if r.xid == xid {
			c.link.heardSince(r.at)
			c.pending = c.pending[i+1:]
			return
		}
	}
}

// handshakeLimit is how long a handshake may take: the session timeout
// granted by the last connect response, else the one asked for (a
// reconnect that takes longer could not save the session anyway), and at
// most maxHandshake (a session asked for a day must not wait a day for a
// server that went silent: trying the next one costs nothing).
func (k *link) handshakeLimit() time.Duration {
	if g := time.Duration(k.granted.Load()); g > 0 {
		return min(g, maxHandshake)
	}
	return min(k.requested, maxHandshake)
}

// maxHandshake bounds every handshake (see handshakeLimit).
const maxHandshake = 10 * time.Second

// SetReadDeadline caps the deadlines of the handshake (see link); once the
// connect response is in, go-zookeeper's own deadlines (two thirds of the
// granted session timeout) pass unchanged.
func (c *linkConn) SetReadDeadline(t time.Time) error {
	return c.Conn.SetReadDeadline(c.cap(t))
}

func (c *linkConn) SetWriteDeadline(t time.Time) error {
	return c.Conn.SetWriteDeadline(c.cap(t))
}

func (c *linkConn) cap(t time.Time) time.Time {
	if t.IsZero() || c.hs.Load() {
		return t
	}
	if limit := time.Now().Add(c.link.handshakeLimit()); t.After(limit) {
		return limit
	}
	return t
}

// framer splits a stream of ZooKeeper packets (a 4-byte big-endian length,
// then that many bytes) and reports the first bytes of each packet's body
// (up to headLen), with the packet's number on the connection.
type framer struct {
	lenBuf [4]byte
	nLen   int
	left   int // body bytes of the current packet still to come
	head   [headLen]byte
	nHead  int
	want   int // head bytes this packet has (min(headLen, length))
	frame  int // number of the current packet, from 0
}

const headLen = 8

func (f *framer) feed(p []byte, packet func(frame int, head []byte)) {
	for len(p) > 0 {
		if f.nLen < 4 {
			k := copy(f.lenBuf[f.nLen:], p)
			f.nLen += k
			p = p[k:]
			if f.nLen < 4 {
				return
			}
			f.left = int(int32(binary.BigEndian.Uint32(f.lenBuf[:])))
			f.want = min(max(f.left, 0), headLen)
			f.nHead = 0
			if f.left <= 0 {
				packet(f.frame, nil)
				f.frame++
				f.nLen = 0
				continue
			}
		}
		if f.nHead < f.want {
			k := copy(f.head[f.nHead:f.want], p)
			f.nHead += k
			f.left -= k
			p = p[k:]
			if f.nHead == f.want {
				packet(f.frame, f.head[:f.want])
			}
		}
		k := min(f.left, len(p))
		f.left -= k
		p = p[k:]
		if f.left == 0 && f.nHead == f.want {
			f.frame++
			f.nLen = 0
		}
	}
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
