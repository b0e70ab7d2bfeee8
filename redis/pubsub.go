package redis

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/redis/internal/guard"
)

// Waiters sleep until they are told on their Locker's wake-up channel of the
// key that their turn has come (see wait.go): a message carries the owner
// token of the one waiter it is for. A Locker keeps one Pub/Sub connection
// per Redis master it waits on (one in all for a single server or Sentinel;
// on Cluster one per master, since a sharded subscription must be made on
// the master of the channel's slot; closed once unused for nodeLinger, so
// that masters that went away leave nothing behind) and multiplexes every
// key it waits on over it. Subscriptions are reference counted by waiters
// and made or dropped by one writer goroutine per connection, so that
// Acquire never blocks on a subscription command. A subscription stays for
// subscriptionLinger after its last waiter left, so that a key under steady
// contention is not subscribed and unsubscribed once per acquisition.
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
// A lost message (reconnect, failover) costs the waiter it was for at most
// its recheck interval (see wait.go).

// hub owns the Locker's Pub/Sub connections.
type hub struct {
	l      *Locker
	mu     sync.Mutex
	closed bool
	nodes  map[string]*node // by master address; "" for a non-cluster client
}

func newHub(l *Locker) *hub { return &hub{l: l, nodes: map[string]*node{}} }

// waiter is one Acquire waiting on one key.
type waiter struct {
	wake  chan struct{}   // receives a signal when the key may be free
	ready <-chan struct{} // closed once the server confirmed the subscription
	n     *node           // nil: no notifications, timers only
	ch    string
	owner string // the Acquire's owner token: the messages meant for it carry it

	movedOnce sync.Once
	moved     chan struct{} // closed when the slot moved (see markMoved)
}

func newWaiter(channel, owner string) *waiter {
	return &waiter{wake: make(chan struct{}, 1), ch: channel, owner: owner, moved: make(chan struct{})}
}

// markMoved records that the waiter's master no longer serves its channel:
// the master dropped the subscription, or refused it with MOVED, because
// the channel's slot is now another master's. The waiter must watch again
// (see hub.rewatch).
func (w *waiter) markMoved() { w.movedOnce.Do(func() { close(w.moved) }) }

// hasMoved reports whether the waiter must watch again (see markMoved).
func (w *waiter) hasMoved() bool { return isClosed(w.moved) }

// closedChan is ready at once: used when no subscription can be made.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// watch registers a waiter for the messages carrying owner on channel,
// subscribing if needed. It does not wait for the subscription; see
// awaitSubscribed.
func (h *hub) watch(ctx context.Context, channel, owner string) *waiter {
	w := newWaiter(channel, owner)
	w.ready = closedChan
	for {
		n := h.node(ctx, channel)
		if n == nil || n.add(w) {
			return w
		}
		// n was retired between the lookup and add; the next lookup
		// finds or makes its successor.
	}
}

// join registers a waiter as watch does, but only if the Locker is
// subscribed to channel already, confirmed by the server (another waiter of
// the key, or one that left less than subscriptionLinger ago); else it
// returns nil and subscribes to nothing. A waiter that joined before its
// request was sent hears every message published after the server ran the
// request.
func (h *hub) join(ctx context.Context, channel, owner string) *waiter {
	h.mu.Lock()
	empty := len(h.nodes) == 0
	h.mu.Unlock()
	if empty {
		return nil // nothing to join: no master lookup on the uncontended path
	}
	n := h.find(ctx, channel, false)
	if n == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	cs := n.chans[channel]
	if cs == nil || !cs.sent || cs.pending > 0 || !isClosed(cs.ready) {
		return nil
	}
	w := newWaiter(channel, owner)
	w.n, w.ready = n, cs.ready
	cs.waiters = append(cs.waiters, w)
	return w
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// rewatch moves a waiter whose master no longer serves its channel, the
// channel's slot having moved, to the slot's new master. The client's slot
// map may name the old master for a while after the move: a reload can ask
// a node that has not heard of the move yet. So rewatch has the map
// reloaded until it names another master, for at most wait; then it
// watches wherever the map points. Should that be the old master still, the
// master refuses the subscription with MOVED and the waiter is marked moved
// again (see node.refused), so a waiter never stays subscribed where no
// release will be announced.
func (h *hub) rewatch(ctx context.Context, old *waiter, wait time.Duration) *waiter {
	old.leave()
	if old.n != nil {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		deadline := time.NewTimer(wait)
		defer deadline.Stop()
	poll:
		for {
			if m, err := h.master(ctx, old.ch); err != nil || m == nil || m.Options().Addr != old.n.addr {
				break
			}
			old.n.reload() // debounced by go-redis
			select {
			case <-tick.C:
			case <-deadline.C:
				break poll
			case <-ctx.Done(): // also when Close begins (Life.Enter)
				break poll // the caller returns; watch anyway, for its leave
			}
		}
	}
	return h.watch(ctx, old.ch, old.owner)
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
func (h *hub) node(ctx context.Context, channel string) *node { return h.find(ctx, channel, true) }

// find returns the connection for channel's master; with create it makes
// one if there is none.
func (h *hub) find(ctx context.Context, channel string, create bool) *node {
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
	if n := h.nodes[addr]; n != nil || !create {
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
	if master != nil {
		n.retire = h.retireNode
	}
	h.nodes[addr] = n
	// Goroutines of the Locker's life: Close waits for them (boundedly)
	// after close has stopped them. The hub closes before Close begins, so
	// Life.Go refuses neither.
	h.l.life.Go(n.writer)
	h.l.life.Go(n.receive)
	return n
}

// retireNode takes n out of the hub and stops it, if nobody has registered
// on it since the writer found it unused; it reports whether it did. A
// waiter that looked n up before and registers after finds it retired and
// looks again (see watch).
func (h *hub) retireNode(n *node) bool {
	h.mu.Lock()
	if h.closed || h.nodes[n.addr] != n {
		h.mu.Unlock()
		return false
	}
	n.mu.Lock()
	if len(n.chans) > 0 || n.unusedFrom.IsZero() {
		n.mu.Unlock()
		h.mu.Unlock()
		return false
	}
	n.retired = true
	delete(h.nodes, n.addr)
	n.mu.Unlock()
	h.mu.Unlock()
	n.shutdown()
	return true
}

// close drops every subscription and stops the hub's goroutines; Close
// waits for them with the Locker's others.
func (h *hub) close() {
	h.mu.Lock()
	h.closed = true
	nodes := h.nodes
	h.nodes = map[string]*node{}
	h.mu.Unlock()
	for _, n := range nodes {
		n.shutdown()
	}
}

// shutdown stops n's goroutines and closes its connection, once n is out
// of the hub. The connection is read after stop is closed, so a replace
// that runs meanwhile (it checks stop) is closed too.
func (n *node) shutdown() {
	close(n.stop)
	n.cancel()
	n.mu.Lock()
	ps := n.ps
	n.mu.Unlock()
	_ = ps.Close() // ends a read in progress
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

	// retire, on Cluster, takes the node out of its hub if it is still
	// unused (see maybeRetire); nil for a non-cluster client, whose one
	// node lives as long as the Locker.
	retire func(*node) bool

	mu         sync.Mutex
	ps         *goredis.PubSub // replaced when the connection fails
	chans      map[string]*chanState
	dirty      map[string]struct{} // channels whose subscription may need a command
	retired    bool                // out of the hub: add refuses waiters
	unusedFrom time.Time           // when chans was last seen empty by the writer; zero while in use
}

// chanState is the subscription of one channel.
type chanState struct {
	waiters   []*waiter     // a message wakes the one whose owner it carries
	left      time.Time     // when the last waiter left: the subscription lingers
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

// nodeLinger is how long a Cluster node's connection stays unused (no
// channel, no subscription) before it is closed. Masters come and go
// (failovers, resharding, restarts on a new address); a connection kept to
// each one ever waited on would pile up, each reconnecting to an address
// that may be gone.
const nodeLinger = 2 * subscriptionLinger

// maybeRetire, run by the writer now and then, retires a Cluster node that
// has had no channel for nodeLinger. It reports whether it did.
func (n *node) maybeRetire(now time.Time) bool {
	if n.retire == nil {
		return false
	}
	n.mu.Lock()
	switch {
	case len(n.chans) > 0:
		n.unusedFrom = time.Time{}
	case n.unusedFrom.IsZero():
		n.unusedFrom = now
	}
	due := !n.unusedFrom.IsZero() && now.Sub(n.unusedFrom) >= nodeLinger
	n.mu.Unlock()
	return due && n.retire(n)
}

// subscriptionLinger is how long a subscription stays after its last
// waiter left. A key under contention is waited on again soon by the same
// Locker: keeping the subscription saves a subscribe and an unsubscribe per
// acquisition, and the attempt that a fresh subscription needs (see wait.go).
// A lingering subscription costs nothing but its entry on the server: a
// message arrives on it only for a waiter of this Locker.
const subscriptionLinger = 10 * time.Second

// wanted reports whether the channel should be subscribed at now.
func (cs *chanState) wanted(now time.Time) bool {
	return len(cs.waiters) > 0 || cs.sent && now.Sub(cs.left) < subscriptionLinger
}

// add registers w on n. It reports false, registering nothing, when n has
// been retired: the caller must find the channel's node again.
func (n *node) add(w *waiter) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.retired {
		return false
	}
	cs := n.chans[w.ch]
	if cs == nil {
		cs = &chanState{ready: make(chan struct{})}
		n.chans[w.ch] = cs
	}
	cs.waiters = append(cs.waiters, w)
	w.n, w.ready = n, cs.ready
	n.unusedFrom = time.Time{}
	if !cs.sent {
		n.markDirty(w.ch)
	}
	return true
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
// never the Acquire as a whole. It returns ctx.Err() if ctx ends first.
func (w *waiter) awaitSubscribed(ctx context.Context, max time.Duration) error {
	max = min(max, time.Second)
	t := time.NewTimer(max)
	defer t.Stop()
	select {
	case <-w.ready:
	case <-w.moved: // refused (see node.refused): watch again
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// leave unregisters the waiter. Its channel's subscription lingers (see
// subscriptionLinger); the writer drops it later. A message meant for a
// waiter that left is not passed on here: the server does that (see
// leaveScript).
func (w *waiter) leave() {
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
	if len(cs.waiters) == 0 {
		cs.left = time.Now()
		if !cs.sent {
			n.markDirty(w.ch) // a subscribe may be pending: cancel it
		}
	}
}

// wakeOwner signals the waiter whose owner token a message carries.
func (cs *chanState) wakeOwner(owner string) {
	for _, w := range cs.waiters {
		if w.owner == owner {
			select {
			case w.wake <- struct{}{}:
			default:
			}
			return
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
	// Lingering subscriptions are looked at now and then: dropped a little
	// after subscriptionLinger, not exactly then.
	sweep := time.NewTicker(subscriptionLinger / 4)
	defer sweep.Stop()
	for {
		select {
		case <-n.kick:
		case <-sweep.C:
			if n.maybeRetire(time.Now()) {
				return
			}
			n.mu.Lock()
			for ch, cs := range n.chans {
				if len(cs.waiters) == 0 {
					n.dirty[ch] = struct{}{}
				}
			}
			n.mu.Unlock()
		case <-n.stop:
			return
		}
		var subs, unsubs []string
		now := time.Now()
		n.mu.Lock()
		for ch := range n.dirty {
			cs := n.chans[ch]
			if cs == nil {
				continue
			}
			want := cs.wanted(now)
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
		case guard.IsServerReply(err):
			// An error reply to one of our commands; the connection itself
			// is fine. A subscription refused because its slot is another
			// master's (a slot map that was stale when the waiter chose
			// this connection) is moved; for other errors (a missing
			// permission) the waiters fall back to their timers.
			if slot, ok := movedSlot(err); ok && n.sharded {
				n.refused(slot)
			}
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
			cs.wakeOwner(m.Payload)
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
		w.markMoved()
	}
	delete(n.chans, ch)
	n.reload()
}

// refused handles a MOVED reply to a sharded subscribe: the channels of slot
// are another master's, so their waiters must watch again (hub.rewatch),
// and the slot map is stale.
func (n *node) refused(slot int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for ch, cs := range n.chans {
		if clusterSlot(ch) != slot {
			continue
		}
		cs.wakeAll()
		for _, w := range cs.waiters {
			w.markMoved()
		}
		delete(n.chans, ch)
	}
	n.reload()
}

// movedSlot returns the slot of a MOVED error reply ("MOVED 3999 host:port").
func movedSlot(err error) (int, bool) {
	var re goredis.Error
	if !errors.As(err, &re) {
		return 0, false
	}
	f := strings.Fields(re.Error())
	if len(f) != 3 || f[0] != "MOVED" {
		return 0, false
	}
	slot, perr := strconv.Atoi(f[1])
	if perr != nil || slot < 0 || slot >= 16384 {
		return 0, false
	}
	return slot, true
}
