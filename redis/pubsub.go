package redis

import (
	"context"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/backend"
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
		log:       backend.Log{L: h.l.cfg.Logger},
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
