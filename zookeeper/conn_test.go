package zookeeper

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
)

// packet is a ZooKeeper packet: a 4-byte length, then the body.
func packet(body ...[]byte) []byte {
	var b []byte
	for _, p := range body {
		b = append(b, p...)
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)
}

func i32(v int32) []byte { return binary.BigEndian.AppendUint32(nil, uint32(v)) }
func i64(v int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) }

func TestFramerSplitsAnyChunking(t *testing.T) {
	stream := append(append(packet(i32(7), i32(3)), packet()...), packet(i32(-2))...)
	stream = append(stream, packet(i32(9), i32(1), []byte("rest of the body"))...)
	want := []string{"0:0000000700000003", "1:", "2:fffffffe", "3:0000000900000001"}
	for chunk := 1; chunk <= len(stream); chunk++ {
		var f framer
		var got []string
		for i := 0; i < len(stream); i += chunk {
			f.feed(stream[i:min(i+chunk, len(stream))], func(frame int, head []byte) {
				got = append(got, fmt.Sprintf("%d:%x", frame, head))
			})
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("chunks of %d: packets %v, want %v", chunk, got, want)
		}
	}
}

// TestLinkHeardOnlyFromReplies: the server is heard from at the send time
// of a request whose reply came, never from a watch notification (which a
// link that drops what the client sends still delivers) nor from when the
// reply was read.
func TestLinkHeardOnlyFromReplies(t *testing.T) {
	k := newLink(4*time.Second, nil)
	client, server := net.Pipe()
	defer server.Close()
	go func() { _, _ = io.Copy(io.Discard, server) }()
	c := &linkConn{Conn: client, link: k}
	defer c.Close()

	feed := func(p []byte) { c.rf.feed(p, c.received) }

	// The handshake: connect request out, connect response in (granting
	// 6s), so the server heard the client when the request went out.
	hsAt := time.Now()
	if _, err := c.Write(packet(i32(0), i64(0), i32(4000), i64(0), make([]byte, 16))); err != nil {
		t.Fatal(err)
	}
	if !k.heard().IsZero() {
		t.Fatalf("heard %v before any answer", k.heard())
	}
	feed(packet(i32(0), i32(6000), i64(42), i32(16), make([]byte, 16)))
	if g := time.Duration(k.granted.Load()); g != 6*time.Second {
		t.Fatalf("granted %v, want 6s", g)
	}
	h0 := k.heard()
	if h0.Before(hsAt) || h0.After(time.Now()) {
		t.Fatalf("heard %v after the handshake, want the connect request's send time (about %v)", h0, hsAt)
	}
	if !strings.Contains(h0.String(), "m=") {
		t.Fatalf("heard %v carries no monotonic clock reading: a wall-clock step would move the loss deadline", h0)
	}
	if !c.cap(time.Now().Add(time.Hour)).After(time.Now().Add(time.Minute)) {
		t.Fatal("deadlines after the handshake are capped to the requested timeout; they must pass unchanged")
	}

	// A ping and a request go out; a notification comes first: nothing heard.
	time.Sleep(5 * time.Millisecond) // distinct send times (the clock, not synchronisation)
	pingAt := time.Now()
	if _, err := c.Write(packet(i32(-2), i32(11))); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	reqAt := time.Now()
	if _, err := c.Write(packet(i32(1), i32(14), []byte("multi"))); err != nil {
		t.Fatal(err)
	}
	feed(packet(i32(xidNotification), i64(-1), i32(0), []byte("event")))
	if h := k.heard(); !h.Equal(h0) {
		t.Fatalf("a watch notification moved heard from %v to %v", h0, h)
	}
	// The ping's reply: heard is its send time, not now.
	time.Sleep(5 * time.Millisecond)
	feed(packet(i32(-2), i64(5), i32(0)))
	if h := k.heard(); h.Before(pingAt) || !h.Before(reqAt) {
		t.Fatalf("after the ping's reply heard = %v, want the ping's send time (%v, before %v)", h, pingAt, reqAt)
	}
	// The request's reply, read in two pieces.
	reply := packet(i32(1), i64(6), i32(0), []byte("result"))
	feed(reply[:6])
	feed(reply[6:])
	if h := k.heard(); h.Before(reqAt) || h.After(time.Now()) {
		t.Fatalf("after the request's reply heard = %v, want its send time (about %v)", h, reqAt)
	}
	if len(c.pending) != 0 {
		t.Fatalf("%d requests still pending after all were answered", len(c.pending))
	}
}

func TestHandshakeDeadlineCapped(t *testing.T) {
	c := &linkConn{link: newLink(time.Second, nil)}
	if d := time.Until(c.cap(time.Now().Add(time.Hour))); d > time.Second {
		t.Fatalf("handshake deadline %v away, want at most the requested session timeout 1s", d)
	}
}

// TestHandshakeDeadlineCappedAtGranted: once a server granted a shorter
// session than asked, a reconnect's handshake is capped at the granted
// timeout, not the asked one.
func TestHandshakeDeadlineCappedAtGranted(t *testing.T) {
	k := newLink(10*time.Second, nil)
	k.granted.Store(int64(1600 * time.Millisecond))
	c := &linkConn{link: k} // a new connection of the link: a reconnect
	if d := time.Until(c.cap(time.Now().Add(time.Hour))); d > 1600*time.Millisecond {
		t.Fatalf("reconnect handshake deadline %v away, want at most the granted session timeout 1.6s", d)
	}
}

func TestUnimplementedRecognised(t *testing.T) {
	// go-zookeeper's text for error codes it has no value for.
	err := fmt.Errorf("creating /locker: %w", fmt.Errorf("unknown error: %v", zk.ErrCode(-6)))
	if !isUnimplemented(err) {
		t.Fatalf("isUnimplemented(%v) = false", err)
	}
	if isUnimplemented(fmt.Errorf("unknown error: %v", zk.ErrCode(-66))) {
		t.Fatal("isUnimplemented matched another code")
	}
}

func TestNewRejectsNilEvents(t *testing.T) {
	l := New(&zk.Conn{}, nil, WithSessionTimeout(4*time.Second))
	defer l.Close()
	if l.cfg.err == nil || !strings.Contains(l.cfg.err.Error(), "nil events channel") {
		t.Fatalf("New with nil events: config error %v, want one about the events channel", l.cfg.err)
	}
}

func TestDriftMarginBelowHalfTimeout(t *testing.T) {
	c := newConfig([]Option{WithSessionTimeout(4 * time.Second), WithDriftMargin(2 * time.Second)})
	if c.err == nil {
		t.Fatal("drift margin of half the session timeout accepted")
	}
	c = newConfig([]Option{WithSessionTimeout(10 * time.Second), WithDriftMargin(4 * time.Second)})
	if c.err != nil {
		t.Fatal(c.err)
	}
	if d := c.driftMargin(6 * time.Second); d != 3*time.Second {
		t.Fatalf("drift margin with a granted timeout of 6s = %v, want it kept at 3s", d)
	}
}

// deadConn is a go-zookeeper connection to nowhere (it keeps trying) and
// its events channel, closed when the test ends.
func deadConn(t *testing.T) (*zk.Conn, <-chan zk.Event) {
	t.Helper()
	conn, events, err := zk.Connect([]string{"127.0.0.1:1"}, 4*time.Second, zk.WithLogger(quietLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	return conn, events
}

// TestNewRefusesSecondReader: the events channel has one reader; a second
// Locker on it is refused (each would miss events), until the first closes.
func TestNewRefusesSecondReader(t *testing.T) {
	conn, ch := deadConn(t)
	a := New(conn, ch, WithSessionTimeout(4*time.Second))
	if a.cfg.err != nil {
		t.Fatal(a.cfg.err)
	}
	b := New(conn, ch, WithSessionTimeout(4*time.Second))
	defer b.Close()
	if err := b.Err(); !errors.Is(err, locker.ErrUnsafeConfig) || !strings.Contains(err.Error(), "events channel") {
		t.Fatalf("second New on one events channel: Err() = %v, want ErrUnsafeConfig naming the events channel", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	c := New(conn, ch, WithSessionTimeout(4*time.Second))
	defer c.Close()
	if err := c.Err(); err != nil {
		t.Fatalf("New on the channel after its reader closed: %v", err)
	}
}

// TestNewRefusesForeignEvents: an events channel that is not the one
// zk.Connect returned with the connection (another connection's, or one of
// the caller's own) is refused: the Locker would follow another session.
func TestNewRefusesForeignEvents(t *testing.T) {
	conn, _ := deadConn(t)
	_, other := deadConn(t)
	for name, ch := range map[string]<-chan zk.Event{"another connection's": other, "a channel of its own": make(chan zk.Event)} {
		l := New(conn, ch, WithSessionTimeout(4*time.Second))
		err := l.Err()
		_ = l.Close()
		if !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), "not the one zk.Connect returned") {
			t.Errorf("New with %s events channel: Err() = %v, want ErrInvalidOption saying it is not the connection's", name, err)
		}
	}
	if same, known := connEvents(conn, other); !known || same {
		t.Fatalf("connEvents(conn, another's channel) = %v, %v: want known and different (go-zookeeper's Conn no longer keeps eventChan?)", same, known)
	}
}
