package redis

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// testNode is a node without a connection: route is fed by hand.
func testNode(sharded bool, reload func()) *node {
	return &node{
		sharded: sharded,
		reload:  reload,
		chans:   map[string]*chanState{},
		dirty:   map[string]struct{}{},
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
	}
}

// subscribed registers a waiter on ch and plays the writer and the server
// up to a confirmed subscription.
func subscribed(n *node, ch string) *waiter {
	w := newWaiter(ch, "")
	n.add(w)
	cs := n.chans[ch]
	cs.sent, cs.pending = true, 1
	n.route(&goredis.Subscription{Kind: "ssubscribe", Channel: ch})
	return w
}

func woken(w *waiter) bool {
	select {
	case <-w.wake:
		return true
	default:
		return false
	}
}

// TestServerDroppedShardSubscription: a sunsubscribe we did not ask for (a
// Cluster master whose slot moved away) wakes the channel's waiters, marks
// them to watch again on the new master, and has the slot map reloaded; the
// confirmation of our own unsubscribe does none of that.
func TestServerDroppedShardSubscription(t *testing.T) {
	reloads := 0
	n := testNode(true, func() { reloads++ })
	w := subscribed(n, "a")
	other := subscribed(n, "b")

	n.route(&goredis.Subscription{Kind: "sunsubscribe", Channel: "a"})
	if !woken(w) || !w.hasMoved() {
		t.Errorf("waiter after its subscription was dropped: woken %v, moved %v; want both", woken(w), w.hasMoved())
	}
	if woken(other) || other.hasMoved() {
		t.Error("a waiter on another channel was disturbed")
	}
	if reloads != 1 {
		t.Errorf("slot map reloads = %d, want 1", reloads)
	}
	if _, ok := n.chans["a"]; ok {
		t.Error("the dropped channel is still in the node's table")
	}

	// Our own unsubscribe: the writer sent it when the last waiter left.
	other.leave()
	cs := n.chans["b"]
	cs.sent = false
	cs.unpending++
	n.route(&goredis.Subscription{Kind: "sunsubscribe", Channel: "b"})
	if other.hasMoved() || reloads != 1 {
		t.Errorf("the confirmation of our own unsubscribe was taken for a dropped subscription (moved %v, reloads %d)", other.hasMoved(), reloads)
	}
	if _, ok := n.chans["b"]; ok {
		t.Error("the channel stays in the node's table after its unsubscribe was confirmed")
	}
}

// TestServerDroppedPlainSubscription: on a plain (not sharded) connection a
// dropped subscription is made again, and its waiters look once.
func TestServerDroppedPlainSubscription(t *testing.T) {
	n := testNode(false, func() { t.Error("reload on a plain connection") })
	w := subscribed(n, "a")
	n.route(&goredis.Subscription{Kind: "unsubscribe", Channel: "a"})
	if !woken(w) || w.hasMoved() {
		t.Errorf("waiter after its plain subscription was dropped: woken %v, moved %v; want woken only", woken(w), w.hasMoved())
	}
	if _, dirty := n.dirty["a"]; !dirty || n.chans["a"].sent {
		t.Error("the dropped plain subscription is not to be made again")
	}
}

// TestMessageWakesItsWaiterOnly: a message carries the owner token of the
// waiter whose turn has come; it wakes that waiter and no other of the
// channel, and one for a waiter that left wakes nobody.
func TestMessageWakesItsWaiterOnly(t *testing.T) {
	n := testNode(false, nil)
	a, b := subscribed(n, "ch"), subscribed(n, "ch")
	a.owner, b.owner = "owner-a", "owner-b"
	n.route(&goredis.Message{Channel: "ch", Payload: "owner-b"})
	if woken(a) || !woken(b) {
		t.Errorf("message for b: a woken %v, b woken %v; want only b", woken(a), woken(b))
	}
	b.leave()
	n.route(&goredis.Message{Channel: "ch", Payload: "owner-b"})
	if woken(a) {
		t.Error("a message for a waiter that left woke another")
	}
}

// TestJoinOnlyConfirmed: join registers a waiter only on a subscription the
// server has confirmed, which lingers after its last waiter left; it never
// starts one.
func TestJoinOnlyConfirmed(t *testing.T) {
	h := &hub{nodes: map[string]*node{}}
	n := testNode(false, nil)
	h.nodes[""] = n
	h.l = &Locker{} // a plain (non-cluster) client: the node is ""
	ctx := t.Context()
	if w := h.join(ctx, "ch", "o"); w != nil {
		t.Fatal("join on a channel nobody subscribed to registered a waiter")
	}
	if len(n.dirty) != 0 {
		t.Error("join asked for a subscription")
	}
	first := subscribed(n, "ch")
	first.leave() // lingers
	if !n.chans["ch"].wanted(time.Now()) {
		t.Error("the subscription does not linger after its last waiter left")
	}
	if n.chans["ch"].wanted(time.Now().Add(subscriptionLinger)) {
		t.Error("the subscription lingers past subscriptionLinger")
	}
	w := h.join(ctx, "ch", "o")
	if w == nil {
		t.Fatal("join on a confirmed, lingering subscription returned nil")
	}
	n.route(&goredis.Message{Channel: "ch", Payload: "o"})
	if !woken(w) {
		t.Error("the joined waiter was not woken by its message")
	}
	// A subscription sent but not yet confirmed is not joined: a message
	// published before the server ran it would be lost.
	cs := &chanState{ready: make(chan struct{}), sent: true, pending: 1}
	n.chans["other"] = cs
	if h.join(ctx, "other", "o") != nil {
		t.Error("join on an unconfirmed subscription registered a waiter")
	}
}

// redisError is an error reply of the server, as go-redis returns one.
type redisError string

func (e redisError) Error() string { return string(e) }
func (redisError) RedisError()     {}

// TestRefusedShardSubscription: a MOVED reply to a sharded subscribe (the
// waiter chose a master from a slot map that was stale) wakes the waiters
// of that slot's channels and marks them to watch again, and has the slot
// map reloaded; channels of other slots and
// other error replies are left alone.
func TestRefusedShardSubscription(t *testing.T) {
	reloads := 0
	n := testNode(true, func() { reloads++ })
	const a, b = "locker:{foo}:wake:x", "locker:{bar}:wake:x" // slots 12182 and 5061
	wa, wb := newWaiter(a, ""), newWaiter(b, "")
	n.add(wa)
	n.add(wb)
	wa.ready, wb.ready = make(chan struct{}), make(chan struct{}) // unconfirmed

	for _, err := range []error{redisError("NOPERM this user has no permissions"), redisError("MOVED x 127.0.0.1:1"), nil} {
		if _, ok := movedSlot(err); ok {
			t.Errorf("movedSlot(%v) took it for a MOVED reply", err)
		}
	}
	slot, ok := movedSlot(redisError("MOVED 12182 127.0.0.1:7001"))
	if !ok || slot != 12182 {
		t.Fatalf("movedSlot = %d, %v; want 12182, true", slot, ok)
	}
	n.refused(slot)
	if !wa.hasMoved() || !woken(wa) {
		t.Errorf("waiter of the refused channel: moved %v, woken %v; want both", wa.hasMoved(), woken(wa))
	}
	if wb.hasMoved() || woken(wb) {
		t.Error("a waiter of another slot was disturbed")
	}
	if _, ok := n.chans[a]; ok {
		t.Error("the refused channel is still in the node's table")
	}
	if _, ok := n.chans[b]; !ok {
		t.Error("the channel of another slot was dropped")
	}
	if reloads != 1 {
		t.Errorf("slot map reloads = %d, want 1", reloads)
	}
}

// TestUnusedClusterNodeRetires: a Cluster node's connection is closed once
// it has had no channel for nodeLinger, and not before, nor while a waiter
// uses it; a waiter that registers after the node was retired is refused
// (watch then finds or makes another); a non-cluster node never retires.
func TestUnusedClusterNodeRetires(t *testing.T) {
	h := &hub{nodes: map[string]*node{}}
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer client.Close()
	n := testNode(true, func() {})
	n.addr = "127.0.0.1:7001"
	n.ps = client.SSubscribe(context.Background())
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.retire = h.retireNode
	h.nodes[n.addr] = n

	t0 := time.Now()
	w := subscribed(n, "a")
	if n.maybeRetire(t0) || n.maybeRetire(t0.Add(time.Hour)) {
		t.Fatal("a node with a waiter retired")
	}
	w.leave()
	// The writer unsubscribed and dropped the channel.
	n.mu.Lock()
	delete(n.chans, "a")
	n.mu.Unlock()
	t1 := t0.Add(2 * time.Hour)
	if n.maybeRetire(t1) || n.maybeRetire(t1.Add(nodeLinger-time.Millisecond)) {
		t.Fatal("retired before nodeLinger unused")
	}
	// A waiter comes and goes: the node was in use, the linger starts again.
	w = subscribed(n, "b")
	w.leave()
	n.mu.Lock()
	delete(n.chans, "b")
	n.mu.Unlock()
	t2 := t1.Add(nodeLinger)
	if n.maybeRetire(t2) {
		t.Fatal("retired right after a waiter used it")
	}
	if !n.maybeRetire(t2.Add(nodeLinger)) {
		t.Fatal("not retired after nodeLinger unused")
	}
	if len(h.nodes) != 0 || !n.stopped() {
		t.Fatalf("after retiring: %d nodes in the hub, stopped %v", len(h.nodes), n.stopped())
	}
	if n.add(newWaiter("c", "")) {
		t.Fatal("a retired node took a waiter")
	}

	single := testNode(false, func() {})
	if single.maybeRetire(t0) || single.maybeRetire(t0.Add(time.Hour)) {
		t.Fatal("a non-cluster node retired")
	}
}
