package zookeeper_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/zookeeper"
)

// sessionRelay is a TCP relay to a ZooKeeper server that reads the connect
// response of every connection through it and keeps each session's
// password, so that a test can take a client's session over (go-zookeeper
// has no way to connect with a given session id and password, nor to show
// the password of its own session).
type sessionRelay struct {
	addr string

	mu        sync.Mutex
	passwords map[int64][]byte
}

func newSessionRelay(t *testing.T, upstream string) *sessionRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &sessionRelay{addr: ln.Addr().String(), passwords: map[int64][]byte{}}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = down.Close()
				continue
			}
			track(down)
			track(up)
			wg.Add(2)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(up, down)
				_ = up.Close()
			}()
			go func() {
				defer wg.Done()
				defer down.Close()
				frame, err := readFrame(up)
				if err != nil {
					return
				}
				if id, pw, ok := parseConnectResponse(frame); ok {
					r.mu.Lock()
					r.passwords[id] = pw
					r.mu.Unlock()
				}
				if _, err := down.Write(frame); err != nil {
					return
				}
				_, _ = io.Copy(down, up)
			}()
		}
	}()
	return r
}

// password returns the password of session id, as the server sent it.
func (r *sessionRelay) password(t *testing.T, id int64) []byte {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	pw, ok := r.passwords[id]
	if !ok {
		t.Fatalf("no connect response for session %#x went through the relay", id)
	}
	return pw
}

// readFrame reads one length-prefixed ZooKeeper packet, prefix included.
func readFrame(r io.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > 1<<20 {
		return nil, fmt.Errorf("packet of %d bytes", size)
	}
	frame := make([]byte, 4+size)
	copy(frame, n[:])
	_, err := io.ReadFull(r, frame[4:])
	return frame, err
}

// parseConnectResponse reads a connect response: length, protocol version,
// timeout, session id, password.
func parseConnectResponse(frame []byte) (id int64, password []byte, ok bool) {
	b := frame[4:]
	if len(b) < 20 {
		return 0, nil, false
	}
	id = int64(binary.BigEndian.Uint64(b[8:16]))
	n := int(int32(binary.BigEndian.Uint32(b[16:20])))
	if n < 0 || len(b) < 20+n {
		return 0, nil, false
	}
	return id, append([]byte(nil), b[20:20+n]...), true
}

// killSession ends session id on the server at addr, as Curator's
// KillSession does: it connects with the session's id and password (which
// moves the session to this connection) and closes the session. The server
// deletes the session's ephemeral nodes at once, and the session's own
// client is told it expired when it reconnects.
func killSession(t *testing.T, addr string, id int64, password []byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	// Connect request: protocol version, last zxid seen, timeout (ms),
	// session id, password.
	req := binary.BigEndian.AppendUint32(nil, 0)
	req = binary.BigEndian.AppendUint64(req, 0)
	req = binary.BigEndian.AppendUint32(req, uint32(sessionTimeout/time.Millisecond))
	req = binary.BigEndian.AppendUint64(req, uint64(id))
	req = binary.BigEndian.AppendUint32(req, uint32(len(password)))
	req = append(req, password...)
	if _, err := c.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(req))), req...)); err != nil {
		t.Fatalf("kill session: %v", err)
	}
	frame, err := readFrame(c)
	if err != nil {
		t.Fatalf("kill session: connect response: %v", err)
	}
	got, _, ok := parseConnectResponse(frame)
	if !ok || got != id {
		t.Fatalf("kill session: the server did not give session %#x back (got %#x): it is not alive", id, got)
	}
	// Close request: xid, opcode -11 (closeSession).
	closeReq := binary.BigEndian.AppendUint32(nil, 1)
	closeReq = binary.BigEndian.AppendUint32(closeReq, uint32(0xFFFFFFF5))
	if _, err := c.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(closeReq))), closeReq...)); err != nil {
		t.Fatalf("kill session: close: %v", err)
	}
	reply, err := readFrame(c)
	if err != nil {
		t.Fatalf("kill session: close reply: %v", err)
	}
	if len(reply) < 20 || binary.BigEndian.Uint32(reply[16:20]) != 0 {
		t.Fatalf("kill session: close reply % x", reply)
	}
}

// A session ended on purpose on the server (Curator's KillSession: another
// connection takes the session over with its id and password and closes
// it): the server deletes the nodes at once, so another client gets the
// keys with higher tokens; when the holder's connection comes back it
// hears that the session expired, and every handle of the session is lost
// at once; the Locker then works again in a new session.
func TestSessionKilled(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	relay := newSessionRelay(t, srv.Addr())
	a, b := newClient(t, relay.addr), newClient(t, srv.Addr())
	ctx := ctxFor(t, time.Minute)
	k1, k2 := testKey(t)+"/1", testKey(t)+"/2"
	h1, h2 := mustAcquire(t, ctx, a.l, k1), mustAcquire(t, ctx, a.l, k2)
	sid := h1.SessionID()
	if h2.SessionID() != sid {
		t.Fatalf("one Locker, two sessions: %#x and %#x", sid, h2.SessionID())
	}
	// Hold the holder's connection still, so that it does not reconnect
	// into the session (and take it back) while it is killed.
	a.px.Blackhole(t)
	killSession(t, srv.Addr(), sid, relay.password(t, sid))
	for i, h := range []*zookeeper.Handle{h1, h2} {
		g, err := b.l.TryAcquire(ctx, h.Key())
		if err != nil {
			t.Fatalf("key %d after its session was killed: %v", i, err)
		}
		if g.Token() <= h.Token() {
			t.Errorf("key %d: token %d after the kill not above %d", i, g.Token(), h.Token())
		}
		if err := g.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	a.px.Heal(t)
	healed := time.Now()
	var lostAt [2]time.Time
	for i, h := range []*zookeeper.Handle{h1, h2} {
		select {
		case <-h.Done():
			lostAt[i] = time.Now()
		case <-time.After(2 * sessionTimeout):
			t.Fatalf("handle %d still held %v after its session was killed", i, 2*sessionTimeout)
		}
		if !errors.Is(h.Err(), locker.ErrLost) || !strings.Contains(h.Err().Error(), "expired") {
			t.Errorf("handle %d: Err() = %v, want ErrLost for the expiry", i, h.Err())
		}
	}
	t.Logf("loss reported %v after the heal", lostAt[0].Sub(healed))
	if d := lostAt[0].Sub(lostAt[1]).Abs(); d > 100*time.Millisecond {
		t.Errorf("the locks of one session were lost %v apart, want at once", d)
	}
	if err := h1.Release(ctx); !errors.Is(err, locker.ErrLost) {
		t.Errorf("Release after the expiry: %v, want ErrLost", err)
	}
	h3 := mustAcquire(t, ctx, a.l, k1)
	if h3.SessionID() == sid {
		t.Errorf("after the expiry the Locker still uses session %#x", sid)
	}
	if h3.Token() <= h1.Token() {
		t.Errorf("token %d in the new session not above %d", h3.Token(), h1.Token())
	}
	if err := h3.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
