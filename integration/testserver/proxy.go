package testserver

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/rs/zerolog"
)

// holdToxic holds every chunk until it is removed, then lets them all
// through, in order: a partition as TCP lives it (nothing passes while it
// lasts, what was sent arrives once it heals, the connections survive). The
// end of a stream passes at once (see Partition).
type holdToxic struct{}

func (*holdToxic) Pipe(stub *toxics.ToxicStub) {
	var held []*stream.StreamChunk
	for {
		select {
		case <-stub.Interrupt:
			// Flush what was held, unless nobody reads it any more: the
			// far end closed its connection meanwhile (a server that
			// expired the session), so the link's writer has gone, and
			// waiting for it would hang the heal.
			for _, c := range held {
				if stub.WriteOutput(c, holdFlushWait) != nil {
					break
				}
			}
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			held = append(held, c)
		}
	}
}

const holdToxicType = "locker_hold"

// holdFlushWait bounds the wait for the link's writer to take each chunk a
// healed hold toxic lets through.
const holdFlushWait = time.Second

// idleToxic closes a connection through which the client has sent nothing
// for Idle milliseconds: a proxy, load balancer or NAT that drops idle
// connections. It watches the client's bytes only (the upstream stream), as
// the server only speaks when spoken to, except for notifications.
type idleToxic struct {
	Idle int64 `json:"idle"`
}

func (t *idleToxic) Pipe(stub *toxics.ToxicStub) {
	d := time.Duration(t.Idle) * time.Millisecond
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-stub.Interrupt:
			return
		case <-timer.C:
			stub.Close()
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if stub.WriteOutput(c, time.Second) != nil {
				return
			}
			if !timer.Stop() {
				<-timer.C
			}
			timer.Reset(d)
		}
	}
}

const idleToxicType = "locker_idle"

// dropNextToxic closes a connection, instead of passing them on, at the
// first bytes the client sends on it, if the connection existed when the
// toxic was added; connections made later pass untouched (see
// Proxy.DropOnNextRequest). sealed is set once the toxic has been added to
// every existing connection: a connection whose state is made afterwards is
// a new one.
type dropNextToxic struct {
	sealed atomic.Bool
}

type dropNextState struct{ armed bool }

func (t *dropNextToxic) NewState() interface{} { return &dropNextState{armed: !t.sealed.Load()} }

func (t *dropNextToxic) Pipe(stub *toxics.ToxicStub) {
	st := stub.State.(*dropNextState)
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil || st.armed {
				stub.Close()
				return
			}
			if stub.WriteOutput(c, time.Second) != nil {
				return
			}
		}
	}
}

const dropNextToxicType = "locker_drop_next"

func init() {
	toxics.Register(holdToxicType, new(holdToxic))
	toxics.Register(idleToxicType, new(idleToxic))
	toxics.Register(dropNextToxicType, new(dropNextToxic))
}

// swallowToxic drops everything, the end of the stream included: the far
// end's close is kept back until the toxic is removed, then passed on. It is
// the one toxic that stands for a partition in which a FIN is lost like any
// other packet (the timeout and hold toxics pass a close at once).
type swallowToxic struct{}

// swallowState records that the stream ended while the toxic held it,
// across the restarts of Pipe when other toxics are added after it.
type swallowState struct{ ended bool }

func (*swallowToxic) NewState() interface{} { return new(swallowState) }

func (*swallowToxic) Pipe(stub *toxics.ToxicStub) {
	st := stub.State.(*swallowState)
	for !st.ended {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				st.ended = true // the input is closed: read it no more
			}
			// Drop the data on the ground.
		}
	}
	<-stub.Interrupt
}

// Cleanup passes on the end of the stream kept back, once removed.
func (*swallowToxic) Cleanup(stub *toxics.ToxicStub) {
	if stub.State.(*swallowState).ended {
		stub.Close()
	}
}

const swallowToxicType = "locker_swallow"

func init() { toxics.Register(swallowToxicType, new(swallowToxic)) }

// Proxy is a TCP fault proxy (Toxiproxy, run in this process) between a client and a
// server: the client connects to Addr, the proxy to the upstream.
type Proxy struct {
	upstream string
	mu       sync.Mutex
	p        *toxiproxy.Proxy
	addr     string
}

var (
	toxiOnce   sync.Once
	toxiServer *toxiproxy.ApiServer
	proxySeq   atomic.Int64
)

// NewProxy starts a proxy to upstream ("host:port") listening on 127.0.0.1 on a free
// port. It is removed at t.Cleanup.
func NewProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	toxiOnce.Do(func() {
		toxiServer = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	})
	name := fmt.Sprintf("locker-%d", proxySeq.Add(1))
	p := toxiproxy.NewProxy(toxiServer, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("testserver: proxy to %s: %v", upstream, err)
	}
	px := &Proxy{upstream: upstream, p: p, addr: p.Listen}
	t.Cleanup(func() {
		px.mu.Lock()
		defer px.mu.Unlock()
		// Remove toxics first: a link blocked in a toxic is only freed by its removal.
		px.p.Toxics.ResetToxics(context.Background())
		px.p.Stop()
	})
	return px
}

// Addr returns "127.0.0.1:port", where clients connect instead of the upstream.
func (p *Proxy) Addr() string { return p.addr }

// Upstream returns the address the proxy forwards to.
func (p *Proxy) Upstream() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.upstream
}

func (p *Proxy) addToxic(t testing.TB, name, typ, stream string, attrs string) {
	t.Helper()
	js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, typ, stream, attrs)
	if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		t.Fatalf("testserver: proxy %s: add %s toxic: %v", p.addr, typ, err)
	}
}

// Blackhole stops all traffic through the proxy, both ways: current and new
// connections stay open, but no byte passes (or is answered) until Heal.
func (p *Proxy) Blackhole(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, dir := range []string{"upstream", "downstream"} {
		if p.p.Toxics.GetToxic("blackhole_"+dir) == nil {
			// A timeout toxic with timeout 0 holds the data and never closes.
			p.addToxic(t, "blackhole_"+dir, "timeout", dir, `{"timeout":0}`)
		}
	}
}

// BlackholeDownstream drops everything the server sends to the client,
// while the client's requests still reach the server: the server applies
// them, and the client never hears the answers. Heal closes the
// connections it held, as after Blackhole.
func (p *Proxy) BlackholeDownstream(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.p.Toxics.GetToxic("blackhole_downstream") == nil {
		p.addToxic(t, "blackhole_downstream", "timeout", "downstream", `{"timeout":0}`)
	}
}

// Partition stops all traffic through the proxy, both ways, as a network
// partition does, until Heal: current and new connections stay open, nothing
// passes, and what was sent meanwhile arrives once it heals (TCP would
// retransmit it), on the same connections.
//
// Blackhole differs in its heal: Toxiproxy's timeout toxic drops what it
// held and, when removed, closes every connection it held, so a Blackhole
// healed is a connection reset (a fault of its own: a server frees a
// session's locks). Use Partition for "cut off, then healed".
//
// A close by the client still passes at once, unlike in a real partition:
// there the server learns of a dead client by TCP keepalive or
// tcp_user_timeout, which a proxy on the loopback cannot mimic. Passing the
// close on stands in for those timeouts firing after the client gave up.
func (p *Proxy) Partition(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, dir := range []string{"upstream", "downstream"} {
		if p.p.Toxics.GetToxic("partition_"+dir) == nil {
			js := fmt.Sprintf(`{"name":"partition_%s","type":%q,"stream":%q,"toxicity":1}`, dir, holdToxicType, dir)
			if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
				t.Fatalf("testserver: proxy %s: partition %s: %v", p.addr, dir, err)
			}
		}
	}
}

// CutUpstream holds everything the client sends, as Partition does, while
// the server's bytes still reach the client: a one-way partition (a
// firewall rule on one direction, an asymmetric route). The server stops
// hearing from the client, yet the client keeps reading what the server
// sends on its own (watch notifications, Pub/Sub messages), which can keep
// a client library's idea of a live connection going. Heal undoes it.
func (p *Proxy) CutUpstream(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.p.Toxics.GetToxic("partition_upstream") == nil {
		js := fmt.Sprintf(`{"name":"partition_upstream","type":%q,"stream":"upstream","toxicity":1}`, holdToxicType)
		if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			t.Fatalf("testserver: proxy %s: cut upstream: %v", p.addr, err)
		}
	}
}

// SilenceDownstream drops everything the server sends to the client from
// now on, the end of a connection included (a server that closes the
// connection is not heard of by the client until Heal), leaving the other
// direction as it is. Together with CutUpstream it is a partition that also
// loses FINs, as a real one does: then the client can learn nothing from
// the server, not even that it closed the connection (a ZooKeeper server
// does, as it expires a session). Unlike Partition or Blackhole it adds no
// toxic on the upstream direction, so a CutUpstream in place keeps holding
// what it held (adding a toxic to a direction restarts its toxics, and a
// restarted hold lets what it held through). Heal undoes it; what the
// server sent meanwhile is lost.
func (p *Proxy) SilenceDownstream(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.p.Toxics.GetToxic("silence_downstream") == nil {
		p.addToxic(t, "silence_downstream", swallowToxicType, "downstream", `{}`)
	}
}

// Silence drops everything through the proxy, both ways, the end of a
// connection included: a partition in which the client's close (FIN or
// RST) is lost like any other packet, as in a real one. Blackhole and
// Partition pass a client's close on at once, which a server takes as the
// end of the session; after Silence the server hears nothing from the
// client, not even that it gave up, and only its own timeouts end the
// session (and the client hears nothing of that either). What was sent
// meanwhile is lost, so a connection that carried data during the silence
// is of no use after Heal, which lets traffic through again and passes on
// the closes kept back.
func (p *Proxy) Silence(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, dir := range []string{"upstream", "downstream"} {
		if p.p.Toxics.GetToxic("silence_"+dir) == nil {
			p.addToxic(t, "silence_"+dir, swallowToxicType, dir, `{}`)
		}
	}
}

// Latency delays every byte from the server to the client by d (so each request and
// response round trip takes at least d longer). A new call replaces the old delay.
func (p *Proxy) Latency(t testing.TB, d time.Duration) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.p.Toxics.GetToxic("latency_downstream") != nil {
		if err := p.p.Toxics.RemoveToxic(context.Background(), "latency_downstream"); err != nil {
			t.Fatalf("testserver: proxy %s: %v", p.addr, err)
		}
	}
	p.addToxic(t, "latency_downstream", "latency", "downstream", fmt.Sprintf(`{"latency":%d,"jitter":0}`, d.Milliseconds()))
}

// DropIdle closes every connection through the proxy, current or new, once
// the client has sent nothing on it for d (a proxy, load balancer or NAT
// that drops idle connections), until Heal.
func (p *Proxy) DropIdle(t testing.TB, d time.Duration) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.p.Toxics.GetToxic("idle_upstream") == nil {
		p.addToxic(t, "idle_upstream", idleToxicType, "upstream", fmt.Sprintf(`{"idle":%d}`, d.Milliseconds()))
	}
}

// DropOnNextRequest makes every connection through the proxy now die at
// the next request its client sends: the proxy closes it instead of passing
// the request on. Connections made later pass. It stands for connections
// that died while idle in a pool (a load balancer or NAT dropped them, the
// server restarted) whose client learns of it only from the reply it does
// not get to the request it sent, too late to know whether the request
// took effect; unlike ResetAll, the client cannot see the close before it
// sends. Heal removes it.
func (p *Proxy) DropOnNextRequest(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	const name = "drop_next_upstream"
	if p.p.Toxics.GetToxic(name) != nil {
		if err := p.p.Toxics.RemoveToxic(context.Background(), name); err != nil {
			t.Fatalf("testserver: proxy %s: %v", p.addr, err)
		}
	}
	p.addToxic(t, name, dropNextToxicType, "upstream", `{}`)
	// The toxic is on every current connection (AddToxicJson returns once
	// it is): from now on, a new connection's state is made unarmed.
	p.p.Toxics.GetToxic(name).Toxic.(*dropNextToxic).sealed.Store(true)
}

// ResetAll closes every current connection through the proxy at once; clients see an
// error on their next read or write. New connections are accepted (and pass, unless a
// toxic is in place) right after.
func (p *Proxy) ResetAll(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	// Stop closes the listener and every connection; Start listens again on the same
	// address (Listen was set to the bound address at the first start).
	p.p.Stop()
	if err := p.p.Start(); err != nil {
		t.Fatalf("testserver: proxy %s: restart after reset: %v", p.addr, err)
	}
}

// Retarget points the proxy at another upstream, as a virtual IP or a
// proxy in front of a database does after a failover: every current
// connection is closed (clients see them reset) and new ones go to
// upstream. Toxics stay.
func (p *Proxy) Retarget(t testing.TB, upstream string) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.upstream = upstream
	// Update stops the proxy (closing its links), sets the upstream under
	// the proxy's own lock and starts it again on the same address.
	if err := p.p.Update(&toxiproxy.Proxy{Name: p.p.Name, Listen: p.addr, Upstream: upstream, Enabled: true}); err != nil {
		t.Fatalf("testserver: proxy %s: restart towards %s: %v", p.addr, upstream, err)
	}
}

// Crash ends the link for good, as the kernel does for a process killed with
// SIGKILL: every connection through the proxy is closed (the server sees its
// client's sessions end, the client sees its connections reset) and the proxy
// stops listening, so the client's reconnects are refused at once instead of
// hanging. Heal does not undo it. A harness's Crash hook is this call on the
// proxy of the client that is to die, with the client then left alone: its
// locks stay on the server until their lease or session ends, as the
// conformance Harness asks.
func (p *Proxy) Crash(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.p.Toxics.ResetToxics(context.Background())
	p.p.Stop()
}

// Heal removes every toxic: traffic passes again, on new connections and on current
// ones that survived (after a Partition, all of them, with what it held; after a
// Blackhole, none: see Partition).
func (p *Proxy) Heal(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.p.Toxics.ResetToxics(context.Background())
}
