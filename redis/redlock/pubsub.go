package redlock

import (
	"context"
	"errors"
	"math/bits"
	"net"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/internal/backoff"
)

// A Locker keeps one Pub/Sub connection per node, made when one of its
// Acquires first waits, and multiplexes every key it waits on over it.
// Subscriptions are counted by waiters and made or dropped by one writer
// goroutine per node, so that an Acquire never blocks on a subscription
// command (a dial to a node that stopped answering can take the client's
// DialTimeout); one reader goroutine per node reads the connection, pings
// it when it has been quiet, and on an error lets go-redis reconnect and
// resubscribe, waking every waiter of the node once the subscriptions are
// confirmed again, since a release may have gone unheard meanwhile.
//
// Notifications only make waiting prompt; safety never depends on them.
//
// A channel nobody waits on any more stays subscribed for a while
// (linger): a key contended once is often contended again at once (the
// holder that released it comes back; the others are still queued), and a
// waiter that finds its key's channel subscribed already skips the
// SUBSCRIBE and UNSUBSCRIBE, and the round that would cover a release
// between its first round and its subscription (see famWait).

// linger is how long a channel stays subscribed after its last waiter
// left; at most maxLinger channels of a node linger at once (the rest are
// dropped when their last waiter leaves).
const (
	linger    = time.Second
	maxLinger = 1024
)

// quietPing is how long the reader waits for a message before it pings.
const quietPing = 5 * time.Second

type subs struct {
	l *Locker
	// opTimeout bounds each Pub/Sub command, and (with quietPing) each
	// read, including the dial and handshake of a reconnect, so that
	// nothing of a node that stopped answering outlives Close for long
	// (the deadline reaches the socket with ContextTimeoutEnabled).
	opTimeout time.Duration

	mu     sync.Mutex
	closed bool
	nodes  []*nodeSub // nil until the first wait
}

func newSubs(l *Locker) *subs {
	nt := MaxNodeTimeout
	if tm, err := l.cfg.timing(l.cfg.TTL); err == nil {
		nt = tm.nodeTimeout
	}
	return &subs{l: l, opTimeout: nt + maxDialAllowance}
}

// chanState is one channel's subscription on one node.
type chanState struct {
	waiters map[*waiter]struct{}
	sent    bool // SUBSCRIBE issued
	ready   bool // confirmed by the node since the last (re)connect
	was     bool // confirmed at least once before
	// idle: subscribed with no waiter since idleAt, until linger passed.
	idle   bool
	idleAt time.Time
}

type nodeSub struct {
	s      *subs
	idx    int // the node's index among the Locker's clients
	ps     *goredis.PubSub
	ctx    context.Context
	cancel context.CancelFunc
	kick   chan struct{}

	mu    sync.Mutex
	chans map[string]*chanState
	dirty map[string]struct{} // channels the writer must look at
	idle  int                 // channels lingering (chanState.idle)
}

// waiter is one Acquire waiting on one key's channel on every node.
type waiter struct {
	s       *subs
	ch      string
	id      string // a family's waiter id: only messages naming it wake it (see wakeTargets)
	nodes   []*nodeSub
	wake    chan struct{} // a release was announced (or may have been missed)
	woke    atomic.Uint64 // bit i: node i announced it (see wakeGrace)
	confirm chan struct{} // one signal per node that confirmed the subscription
}

// rouse records that node announced a release to w, and wakes it.
func (w *waiter) rouse(node int) {
	w.woke.Or(1 << node)
	signal(w.wake)
}

// wakeGrace is how long a waiter woken by fewer than a majority of the
// nodes waits for the others' messages before its round: a release
// deletes the lock on every node in parallel, and a round that reaches
// the majority before their deletes is refused, which costs a request per
// node and another round.
const wakeGrace = 2 * time.Millisecond

// awaitMajority waits, after a wake-up, until need nodes announced a
// release since the last call, at most wakeGrace, or until ctx ends; it
// then forgets the announcements.
func (w *waiter) awaitMajority(ctx context.Context, need int) {
	if bits.OnesCount64(w.woke.Load()) < need {
		t := time.NewTimer(wakeGrace)
	wait:
		for bits.OnesCount64(w.woke.Load()) < need {
			select {
			case <-w.wake:
			case <-t.C:
				break wait
			case <-ctx.Done():
				break wait
			}
		}
		t.Stop()
	}
	w.woke.Store(0)
	select { // a wake-up the announcements above account for
	case <-w.wake:
	default:
	}
}

// watch subscribes a waiter to channel on every node (asynchronously; see
// awaitSubscribed). id is a family's waiter id ("" for the mutex's).
func (s *subs) watch(channel, id string) *waiter {
	w := &waiter{s: s, ch: channel, id: id, wake: make(chan struct{}, 1), confirm: make(chan struct{}, len(s.l.clients))}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return w
	}
	if s.nodes == nil {
		for i, c := range s.l.clients {
			s.nodes = append(s.nodes, s.start(i, c))
		}
	}
	w.nodes = s.nodes
	s.mu.Unlock()
	for _, n := range w.nodes {
		n.mu.Lock()
		cs := n.chans[channel]
		if cs == nil {
			cs = &chanState{waiters: map[*waiter]struct{}{}}
			n.chans[channel] = cs
		}
		cs.waiters[w] = struct{}{}
		if cs.idle {
			cs.idle = false
			n.idle--
		}
		if cs.ready {
			signal(w.confirm)
		}
		sent := cs.sent
		if !sent {
			n.dirty[channel] = struct{}{}
		}
		n.mu.Unlock()
		if !sent {
			signal(n.kick)
		}
	}
	return w
}

// subscribed reports whether channel's subscription is confirmed on at
// least need nodes now (a waiter of it, or its linger, keeps it): a
// waiter that watches it before its first round hears every release
// that round does not see.
func (s *subs) subscribed(channel string, need int) bool {
	s.mu.Lock()
	nodes := s.nodes
	s.mu.Unlock()
	got := 0
	for _, n := range nodes {
		n.mu.Lock()
		if cs := n.chans[channel]; cs != nil && cs.ready {
			got++
		}
		n.mu.Unlock()
	}
	return got >= need
}

// awaitSubscribed waits until need nodes confirmed the subscription, or at
// most timeout (nodes that do not answer must not hold the waiter up: it
// has its back-off), or until ctx ends (then it returns ctx.Err()).
func (w *waiter) awaitSubscribed(ctx context.Context, need int, timeout time.Duration) error {
	if len(w.nodes) == 0 {
		return nil
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	for got := 0; got < need; got++ {
		select {
		case <-w.confirm:
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// leave unsubscribes the waiter; the node's writer drops a channel nobody
// waits on any more.
func (w *waiter) leave() {
	for _, n := range w.nodes {
		n.mu.Lock()
		cs := n.chans[w.ch]
		empty := false
		if cs != nil {
			delete(cs.waiters, w)
			empty = len(cs.waiters) == 0
		}
		if empty {
			n.dirty[w.ch] = struct{}{}
		}
		n.mu.Unlock()
		if empty {
			signal(n.kick)
		}
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// start makes the Pub/Sub connection of one node and its two goroutines,
// which the Locker counts as active until they end.
func (s *subs) start(idx int, c goredis.UniversalClient) *nodeSub {
	ctx, cancel := context.WithCancel(context.Background())
	n := &nodeSub{s: s, idx: idx, ps: c.Subscribe(ctx), ctx: ctx, cancel: cancel, kick: make(chan struct{}, 1), chans: map[string]*chanState{}, dirty: map[string]struct{}{}}
	// subs closes before Close begins (see Close): Life.Go refuses
	// neither.
	s.l.life.Go(n.writer)
	s.l.life.Go(n.reader)
	return n
}

// writer makes and drops subscriptions as waiters come and go. It looks
// only at the channels marked dirty since its last round, not at every
// channel the node has subscribed: a Locker waiting on many keys at once
// would otherwise pay for all of them on each wait that starts or ends.
func (n *nodeSub) writer() {
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.kick:
		}
		var add, drop []string
		now := time.Now()
		n.mu.Lock()
		for ch := range n.dirty {
			delete(n.dirty, ch)
			cs := n.chans[ch]
			switch {
			case cs == nil:
			case len(cs.waiters) > 0 && !cs.sent:
				cs.sent = true
				add = append(add, ch)
			case len(cs.waiters) > 0:
			case cs.sent && !cs.idle && n.idle < maxLinger:
				cs.idle, cs.idleAt = true, now
				n.idle++
				time.AfterFunc(linger, func() { n.look(ch) })
			case cs.idle && now.Sub(cs.idleAt) < linger:
				// A waiter came and went since: its own linger's timer
				// looks again.
			default:
				if cs.idle {
					n.idle--
				}
				delete(n.chans, ch)
				if cs.sent {
					drop = append(drop, ch)
				}
			}
		}
		n.mu.Unlock()
		// go-redis records the channels even when the command fails, and
		// subscribes to them again when it reconnects.
		ctx, cancel := context.WithTimeout(n.ctx, n.s.opTimeout)
		if len(add) > 0 {
			_ = n.ps.Subscribe(ctx, add...)
		}
		if len(drop) > 0 {
			_ = n.ps.Unsubscribe(ctx, drop...)
		}
		cancel()
	}
}

// look has the writer look at channel again.
func (n *nodeSub) look(channel string) {
	n.mu.Lock()
	n.dirty[channel] = struct{}{}
	n.mu.Unlock()
	signal(n.kick)
}

// reader reads the node's messages and wakes the waiters they concern.
func (n *nodeSub) reader() {
	retry := backoff.New(50*time.Millisecond, time.Second)
	healthy := true
	for {
		ctx, cancel := context.WithTimeout(n.ctx, quietPing+n.s.opTimeout)
		msg, err := n.ps.ReceiveTimeout(ctx, quietPing)
		cancel()
		if n.ctx.Err() != nil {
			return
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				ctx, cancel := context.WithTimeout(n.ctx, n.s.opTimeout)
				_ = n.ps.Ping(ctx)
				cancel()
				continue
			}
			if healthy {
				n.lostConnection()
				healthy = false
			}
			if !backoff.Sleep(n.ctx, retry.Next()) {
				return
			}
			continue
		}
		healthy = true
		retry.Reset()
		switch m := msg.(type) {
		case *goredis.Subscription:
			if m.Kind == "subscribe" {
				n.confirmed(m.Channel)
			}
		case *goredis.Message:
			n.deliver(m)
		}
	}
}

// deliver wakes the waiters a message concerns: every waiter of its
// channel, or, for a lock family's message, those it names (a release
// wakes the waiters it admits, not every waiter of the key).
func (n *nodeSub) deliver(m *goredis.Message) {
	targets := wakeTargets(m.Payload)
	n.mu.Lock()
	defer n.mu.Unlock()
	cs := n.chans[m.Channel]
	if cs == nil {
		return
	}
	if targets == nil {
		for w := range cs.waiters {
			w.rouse(n.idx)
		}
		return
	}
	named := make(map[string]bool, len(targets))
	for _, id := range targets {
		named[id] = true
	}
	for w := range cs.waiters {
		if named[w.id] {
			w.rouse(n.idx)
		}
	}
}

// confirmed records the node's confirmation of a subscription; after a
// reconnect it also wakes the channel's waiters, who may have missed a
// release meanwhile.
func (n *nodeSub) confirmed(ch string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	cs := n.chans[ch]
	if cs == nil {
		return
	}
	cs.ready = true
	for w := range cs.waiters {
		signal(w.confirm)
		if cs.was {
			w.rouse(n.idx)
		}
	}
	cs.was = true
}

// lostConnection marks every subscription of the node unconfirmed.
func (n *nodeSub) lostConnection() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, cs := range n.chans {
		cs.ready = false
	}
}

// close ends every node's Pub/Sub connection and goroutines, without
// waiting: Close waits for them with the Locker's other goroutines, at most
// closeGrace (or, with clients of its own, until closing their connections
// ended them). go-redis' PubSub.Close waits for a (re)connect in progress,
// which a node that accepts and never answers makes last until its
// deadline, so each node's is closed on a goroutine of its own.
func (s *subs) close() {
	s.mu.Lock()
	s.closed = true
	nodes := s.nodes
	s.mu.Unlock()
	for _, n := range nodes {
		n.cancel()
		s.l.life.Go(func() { _ = n.ps.Close() })
	}
}
