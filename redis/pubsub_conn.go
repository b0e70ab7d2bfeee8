package redis

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/backoff"
	"github.com/go-locker/locker/redis/internal/guard"
)

// One Pub/Sub connection of the hub (see pubsub.go): its subscriptions,
// the writer that makes and drops them, and the reader that routes the
// messages to the waiters and replaces the connection when it fails.

// node is one Pub/Sub connection.
type node struct {
	ctx       context.Context // ends when the hub closes
	cancel    context.CancelFunc
	addr      string // the master's address; "" for a non-cluster client
	sharded   bool
	reload    func() // has the client reload its Cluster slot map
	newPubSub func() *goredis.PubSub
	log       backend.Log   // WithLogger: connection replacements, moved slots
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
	pinged := false // a PING is unanswered
	// Do not spin on a server that is down.
	retry := backoff.New(50*time.Millisecond, 2*time.Second)
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
			pinged = false
			retry.Reset()
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
			n.replace(ps, errors.New("a PING went unanswered"))
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
			n.replace(ps, err)
			pinged = false
			if !backoff.Sleep(ctx, retry.Next(), n.stop) {
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
func (n *node) replace(old *goredis.PubSub, why error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ps != old || n.stopped() {
		return
	}
	n.log.Warn("locker: redis Pub/Sub connection replaced; its waiters look again", slog.String("addr", n.addr), backend.Err(why))
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
	n.log.Info("locker: redis Cluster slot moved; its waiters subscribe again", slog.Int("slot", slot), slog.String("addr", n.addr))
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
