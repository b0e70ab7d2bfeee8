package redis

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
)

// Waiters sleep until a release is announced on the key's wake-up channel.
// A Locker keeps one Pub/Sub connection per Redis master it waits on (one in
// all for a single server or Sentinel; on Cluster one per master, since a
// sharded subscription must be made on the master of the channel's slot) and
// multiplexes every key it waits on over it. Subscriptions are reference
// counted by waiters and made or dropped by one writer goroutine per
// connection, so that Acquire never blocks on a subscription command.
//
// The connection is read by our own goroutine, which also checks its health
// (a PING when nothing arrived for healthInterval) and replaces it when it
// fails, subscribing again channel by channel. go-redis' own reconnection is
// not relied on: it resubscribes all shard channels in one SSUBSCRIBE,
// which Redis Cluster refuses when they span slots.
//
// When a channel's slot moves to another Cluster master (resharding), the
// old master drops the subscriptions of the slot's shard channels and says
// so (a sunsubscribe it sends unasked). Its waiters are woken, since a
// release may have gone unheard, and move to the slot's new master.
//
// Notifications only make waiting prompt; they are not needed for safety.
// A lost message (reconnect, failover) costs at most the holder's remaining
// lease or the Locker's retry interval.

// hub owns the Locker's Pub/Sub connections.
type hub struct {
	l      *Locker
	mu     sync.Mutex
	closed bool
	nodes  map[string]*node // by master address; "" for a non-cluster client
	wg     sync.WaitGroup
}

func newHub(l *Locker) *hub { return &hub{l: l, nodes: map[string]*node{}} }

// waiter is one Acquire waiting on one key.
type waiter struct {
	wake  chan struct{}   // receives a signal when the key may be free
	ready <-chan struct{} // closed once the server confirmed the subscription
	n     *node           // nil: no notifications, timers only
	ch    string
	moved atomic.Bool // the master dropped the subscription: the slot moved
}

// hasMoved reports whether the waiter must watch again (see hub.rewatch):
// its master dropped the subscription because the slot moved.
func (w *waiter) hasMoved() bool { return w.moved.Load() }

// closedChan is ready at once: used when no subscription can be made.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// watch registers a waiter for releases announced on channel. It does not
// wait for the subscription; see awaitSubscribed.
func (h *hub) watch(ctx context.Context, channel string) *waiter {
	w := &waiter{wake: make(chan struct{}, 1), ready: closedChan, ch: channel}
	n := h.node(ctx, channel)
	if n != nil {
		n.add(w)
	}
	return w
}

// rewatch moves a waiter whose master dropped its subscription, the
// channel's slot having moved, to the slot's new master. The client's slot
// map may name the old master for a moment after the move (dropped has it
// reloaded): rewatch waits for it to name another, for at most a second.
func (h *hub) rewatch(ctx context.Context, closing <-chan struct{}, old *waiter) *waiter {
	old.leave(false)
	for deadline := time.Now().Add(time.Second); old.n != nil && time.Now().Before(deadline); {
		if m, err := h.master(ctx, old.ch); err != nil || m == nil || m.Options().Addr != old.n.addr {
			break
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			deadline = time.Time{} // the caller returns; watch anyway, for its leave
		case <-closing:
			deadline = time.Time{}
		}
	}
	return h.watch(ctx, old.ch)
}

// master returns the Cluster master of channel's slot, or nil when the
// client is not a cluster client.
func (h *hub) master(ctx context.Context, channel string) (*goredis.Client, error) {
	cc, ok := h.l.client.(*goredis.ClusterClient)
	if !ok {
		return nil, nil
	}
	return cc.MasterForKey(ctx, channel)
}

// node returns the connection for channel's master, making it if needed,
// or nil when there is none (closed, or the cluster's slot map is unknown).
func (h *hub) node(ctx context.Context, channel string) *node {
	var addr string
	master, err := h.master(ctx, channel) // on Cluster: the slot's master
	if err != nil {
		return nil
	}
	if master != nil {
		addr = master.Options().Addr
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	if n := h.nodes[addr]; n != nil {
		return n
	}
	newPubSub := func() *goredis.PubSub {
		if h.l.sharded {
			return master.SSubscribe(context.Background())
		}
		return h.l.client.Subscribe(context.Background())
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &node{
		ctx:     ctx,
		cancel:  cancel,
		addr:    addr,
		sharded: h.l.sharded,
		reload: func() {
			if cc, ok := h.l.client.(*goredis.ClusterClient); ok {
				cc.ReloadState(context.Background())
			}
		},
		newPubSub: newPubSub,
		ps:        newPubSub(),
		chans:     map[string]*chanState{},
		dirty:     map[string]struct{}{},
		kick:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
	}
	h.nodes[addr] = n
	h.wg.Add(2)
	go func() { defer h.wg.Done(); n.writer() }()
	go func() { defer h.wg.Done(); n.receive() }()
	return n
}

// close drops every subscription and waits for the hub's goroutines.
func (h *hub) close() {
	h.mu.Lock()
	h.closed = true
	nodes := h.nodes
	h.nodes = map[string]*node{}
	h.mu.Unlock()
	for _, n := range nodes {
		close(n.stop)
		n.cancel()
		n.mu.Lock()
		ps := n.ps
		n.mu.Unlock()
		_ = ps.Close() // ends a read in progress
	}
	h.wg.Wait()
}

// node is one Pub/Sub connection.
type node struct {
	ctx       context.Context // ends when the hub closes
	cancel    context.CancelFunc
	addr      string // the master's address; "" for a non-cluster client
	sharded   bool
	reload    func() // has the client reload its Cluster slot map
	newPubSub func() *goredis.PubSub
	kick      chan struct{} // wakes the writer
	stop      chan struct{}

	mu    sync.Mutex
	ps    *goredis.PubSub // replaced when the connection fails
	chans map[string]*chanState
	dirty map[string]struct{} // channels whose subscription may need a command
}

// chanState is the subscription of one channel.
type chanState struct {
	waiters   []*waiter     // in arrival order: wake-ups go to the first
	sent      bool          // our last command for it was a subscribe
	pending   int           // subscribe confirmations still to come
	unpending int           // unsubscribe confirmations still to come
	ready     chan struct{} // closed when sent and confirmed
}

// idle reports whether the channel state can go: nobody waits, and nothing
// we sent for it is unanswered.
func (cs *chanState) idle() bool {
	return len(cs.waiters) == 0 && !cs.sent && cs.pending == 0 && cs.unpending == 0
}

func (n *node) add(w *waiter) {
	n.mu.Lock()
	defer n.mu.Unlock()
	cs := n.chans[w.ch]
	if cs == nil {
		cs = &chanState{ready: make(chan struct{})}
		n.chans[w.ch] = cs
	}
	cs.waiters = append(cs.waiters, w)
	w.n, w.ready = n, cs.ready
	if !cs.sent {
		n.markDirty(w.ch)
	}
}

func (n *node) markDirty(ch string) {
	n.dirty[ch] = struct{}{}
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// awaitSubscribed waits until the subscription is confirmed, but at most
// max (capped at one second): a slow subscription delays the next attempt,
// never the Acquire as a whole.
func (w *waiter) awaitSubscribed(ctx context.Context, closing <-chan struct{}, max time.Duration) error {
	max = min(max, time.Second)
	t := time.NewTimer(max)
	defer t.Stop()
	select {
	case <-w.ready:
	case <-t.C:
	case <-ctx.Done():
		return ctxErr(ctx)
	case <-closing:
		return locker.ErrClosed
	}
	return nil
}

// leave unregisters the waiter. A waiter that leaves without the lock
// passes a wake-up on to the next one, in case it swallowed the
// notification that was meant for whoever comes next.
func (w *waiter) leave(passOn bool) {
	n := w.n
	if n == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	cs := n.chans[w.ch]
	if cs == nil {
		return
	}
	for i, o := range cs.waiters {
		if o == w {
			cs.waiters = append(cs.waiters[:i], cs.waiters[i+1:]...)
			break
		}
	}
	if passOn {
		cs.wakeOne()
	}
	if len(cs.waiters) == 0 {
		n.markDirty(w.ch)
	}
}

// wakeOne signals the first waiter that has no signal pending. One
// release lets one holder in, so waking every waiter of this Locker would
// only make all but one of them try in vain.
func (cs *chanState) wakeOne() {
	for _, w := range cs.waiters {
		select {
		case w.wake <- struct{}{}:
			return
		default:
		}
	}
}

func (cs *chanState) wakeAll() {
	for _, w := range cs.waiters {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// writer sends subscribe and unsubscribe commands so that the connection is
// subscribed to exactly the channels that have waiters.
func (n *node) writer() {
	for {
		select {
		case <-n.kick:
		case <-n.stop:
			return
		}
		var subs, unsubs []string
		n.mu.Lock()
		for ch := range n.dirty {
			cs := n.chans[ch]
			if cs == nil {
				continue
			}
			want := len(cs.waiters) > 0
			switch {
			case want && !cs.sent:
				cs.sent = true
				cs.pending++
				subs = append(subs, ch)
			case !want && cs.sent:
				cs.sent = false
				cs.unpending++
				cs.ready = make(chan struct{})
				unsubs = append(unsubs, ch)
			}
			if cs.idle() {
				delete(n.chans, ch)
			}
		}
		clear(n.dirty)
		ps := n.ps
		n.mu.Unlock()
		// A command sent on a connection that is being replaced fails or
		// is lost; the replacement marks every channel for resubscription.
		n.send(ps, unsubs, false)
		n.send(ps, subs, true)
	}
}

// send issues the commands. Errors need no handling here: a failed
// connection is replaced by receive, which resubscribes, and waiters fall
// back to their timers meanwhile.
func (n *node) send(ps *goredis.PubSub, chs []string, subscribe bool) {
	if len(chs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !n.sharded {
		if subscribe {
			_ = ps.Subscribe(ctx, chs...)
		} else {
			_ = ps.Unsubscribe(ctx, chs...)
		}
		return
	}
	// A sharded (un)subscribe may only name channels of one slot.
	for _, ch := range chs {
		select {
		case <-n.stop:
			return
		default:
		}
		if subscribe {
			_ = ps.SSubscribe(ctx, ch)
		} else {
			_ = ps.SUnsubscribe(ctx, ch)
		}
	}
}

// healthInterval is how long the connection may stay silent before a PING
// checks it; a PING unanswered for as long again replaces the connection.
const healthInterval = 3 * time.Second

// receive reads confirmations and release notifications and routes them to
// waiters, until the hub closes. It runs on the goroutine that reads the
// socket, so a notification reaches the waiter in one goroutine switch.
func (n *node) receive() {
	ctx := n.ctx
	var (
		pinged  bool // a PING is unanswered
		backoff time.Duration
	)
	for {
		n.mu.Lock()
		ps := n.ps
		n.mu.Unlock()
		msg, err := ps.ReceiveTimeout(ctx, healthInterval)
		if n.stopped() {
			return
		}
		var ne net.Error
		switch {
		case err == nil:
			pinged, backoff = false, 0
			n.route(msg)
		case errors.As(err, &ne) && ne.Timeout():
			if !pinged {
				pctx, pcancel := context.WithTimeout(ctx, healthInterval)
				pinged = ps.Ping(pctx) == nil
				pcancel()
				if pinged {
					continue
				}
			}
			n.replace(ps)
			pinged = false
		case isServerReply(err):
			// An error reply to one of our commands (a channel whose slot
			// moved, a missing permission): its waiters fall back to their
			// timers; the connection itself is fine.
		default:
			n.replace(ps)
			pinged = false
			// Do not spin on a server that is down.
			backoff = min(max(2*backoff, 50*time.Millisecond), 2*time.Second)
			select {
			case <-time.After(backoff):
			case <-n.stop:
				return
			}
		}
	}
}

func (n *node) stopped() bool {
	select {
	case <-n.stop:
		return true
	default:
		return false
	}
}

// isServerReply reports whether err is an error reply of the server rather
// than a failure of the connection.
func isServerReply(err error) bool {
	var re goredis.Error
	return errors.As(err, &re)
}

// replace swaps a failed connection for a new one and has every channel
// that has waiters subscribed again. Releases announced meanwhile were
// missed, so every waiter looks once.
func (n *node) replace(old *goredis.PubSub) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ps != old || n.stopped() {
		return
	}
	_ = old.Close()
	n.ps = n.newPubSub()
	for ch, cs := range n.chans {
		cs.sent, cs.pending, cs.unpending = false, 0, 0
		if len(cs.waiters) == 0 {
			delete(n.chans, ch)
			continue
		}
		cs.wakeAll()
		n.markDirty(ch)
	}
}

func (n *node) route(msg any) {
	switch m := msg.(type) {
	case *goredis.Subscription:
		switch m.Kind {
		case "subscribe", "ssubscribe":
			n.confirmed(m.Channel)
		case "unsubscribe", "sunsubscribe":
			n.unsubscribed(m.Channel)
		}
	case *goredis.Message:
		n.mu.Lock()
		if cs := n.chans[m.Channel]; cs != nil {
			cs.wakeOne()
		}
		n.mu.Unlock()
	}
}

func (n *node) confirmed(ch string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	cs := n.chans[ch]
	if cs == nil {
		return
	}
	if cs.pending > 0 {
		cs.pending--
	} else {
		// Not one we asked for (go-redis resubscribed after a reconnect of
		// its own): releases announced meanwhile were missed.
		cs.wakeAll()
	}
	if cs.sent && cs.pending == 0 {
		select {
		case <-cs.ready:
		default:
			close(cs.ready)
		}
	}
	if cs.idle() {
		delete(n.chans, ch)
	}
}

// unsubscribed handles an unsubscribe reply: the confirmation of one of ours,
// or the server dropping the subscription unasked, which a Cluster master
// does when the channel's slot moves to another master.
func (n *node) unsubscribed(ch string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	cs := n.chans[ch]
	if cs == nil {
		return
	}
	if cs.unpending > 0 {
		cs.unpending--
		if cs.idle() {
			delete(n.chans, ch)
		}
		return
	}
	// A release may have been announced where nobody listened: every
	// waiter looks once.
	cs.wakeAll()
	if !n.sharded {
		// Redis does not do this to plain channels; should it, subscribe
		// again.
		cs.sent, cs.pending = false, 0
		cs.ready = make(chan struct{})
		if len(cs.waiters) > 0 {
			n.markDirty(ch)
		}
		return
	}
	// The slot moved: this master will refuse the channel from now on. The
	// waiters watch again (hub.rewatch), on the slot's new master, once the
	// client's slot map knows it.
	for _, w := range cs.waiters {
		w.moved.Store(true)
	}
	delete(n.chans, ch)
	n.reload()
}
