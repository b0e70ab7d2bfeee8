package redlock

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/lease"
	"github.com/go-locker/locker/redis/internal/guard"
	"github.com/go-locker/locker/redis/internal/releases"
)

var _ locker.Locker = (*Locker)(nil)

// ErrNoQuorum reports an acquisition that could not be established on a
// majority of the nodes in time: too many nodes did not answer or failed, or
// too little of the lease was left once a majority had granted it. It is
// not locker.ErrNotAcquired, which means that other holders have the key on
// a majority of the nodes: a caller that skips work on "not acquired" must
// not silently skip it during an outage. The message says how many nodes
// granted, were held by another client and failed, and why.
var ErrNoQuorum = errors.New("redlock: no majority of nodes")

// ErrEvictionPolicy reports a node whose maxmemory-policy is not noeviction:
// it may delete held locks and, under an allkeys-* policy, the fencing
// counters, after which tokens go backwards. It is the redis package's
// ErrEvictionPolicy (the same value, from one shared check). Acquire and
// TryAcquire refuse to take locks while any node has such a policy, with
// an error wrapping it that names the node and the policy; WithAllowEviction
// turns the check off. It wraps locker.ErrUnsafeConfig.
var ErrEvictionPolicy = guard.ErrEvictionPolicy

// Locker takes locks over N independent Redis nodes with the Redlock
// algorithm and hands out fencing tokens that increase per key (see the
// package documentation). It is safe for concurrent use. Make it with New
// or locker.Open, and Close it when done.
type Locker struct {
	clients    []goredis.UniversalClient
	addrs      []string // for error messages
	all        []int    // 0..N-1
	quorum     int
	ownClients bool     // opened from a URL: Close closes them too
	conns      *connSet // of the clients Open made; nil with New
	cfg        config
	subs       *subs
	contacted  []atomic.Bool          // per node: its first request was made (see dialAllowance)
	scripts    []scriptState          // per node: what its script cache holds (see runScript)
	down       []atomic.Bool          // per node: its last request ran out of time (see dialAllowance)
	vet        vetter                 // what each node's server said it is (see vet.go)
	renewals   lease.Batcher[*Handle] // renewals of one TTL in one round (renewMany)

	// life admits the calls, holds the handles for Close, and counts the
	// calls and goroutines that may still talk to the nodes (requests,
	// renewals, clean-ups, Pub/Sub readers and writers), which Close waits
	// for, boundedly. Its config error is that of the clients or options.
	life *backend.Life[*Handle]

	// enterFn and runFn are the handles' lease.Ops.Enter and
	// lease.RenewConfig.Go, made once: a func value of a method or a
	// closure allocates, and every acquisition would pay for them.
	enterFn func() (bool, func())
	runFn   func(func()) bool
	// closing is life.Closing().Done(): the rounds' fanout stops waiting
	// when Close begins.
	closing <-chan struct{}
}

// New returns a Locker over clients, one per independent Redis node: N ≥ 3
// and odd (3 or 5 is usual), each a *goredis.Client of its own server (a
// Sentinel failover client is one node). A *goredis.ClusterClient or
// *goredis.Ring is not a node: Cluster already shards keys over masters and
// Ring remaps them when a shard fails. A wrong set of clients or an invalid
// option is reported by Err and by every Acquire and TryAcquire, with an
// error wrapping locker.ErrInvalidOption.
//
// New does not contact the nodes: each is checked when it first answers (its
// maxmemory-policy must be noeviction, and no two nodes may be one server;
// see "Unsafe configurations" in the package documentation), and an acquire
// that finds either refuses with an error naming the nodes.
//
// clients may be a []*goredis.Client or a []goredis.UniversalClient, as
// the caller has them. Each must have ContextTimeoutEnabled, which lets
// the node timeout reach the socket, so that a request to a node that
// stopped answering ends with its round instead of at the client's
// ReadTimeout; a client without it is refused (clients Open makes have
// it). The Locker does not close the clients: the caller keeps owning them
// and must close them after the Locker.
func New[C goredis.UniversalClient](clients []C, opts ...Option) *Locker {
	return newLocker(universal(clients), opts)
}

// universal returns clients as the interface the Locker keeps.
func universal[C goredis.UniversalClient](clients []C) []goredis.UniversalClient {
	out := make([]goredis.UniversalClient, len(clients))
	for i, c := range clients {
		out[i] = c
	}
	return out
}

func newLocker(clients []goredis.UniversalClient, opts []Option) *Locker {
	cfg, cfgErr := newConfig(opts)
	l := &Locker{
		renewals: lease.Batcher[*Handle]{Max: 128},
		clients:  clients,
		cfg:      cfg,
		quorum:   len(clients)/2 + 1,
	}
	l.addrs = make([]string, len(clients))
	l.contacted = make([]atomic.Bool, len(clients))
	l.scripts = make([]scriptState, len(clients))
	l.down = make([]atomic.Bool, len(clients))
	l.vet.nodes = make([]nodeVet, len(clients))
	for i := range clients {
		l.all = append(l.all, i)
	}
	if err := l.checkClients(); err != nil && cfgErr == nil {
		cfgErr = err
	}
	l.life = backend.NewLife[*Handle](cfgErr)
	l.renewals.Send, l.renewals.Go = l.renewMany, l.life.Go
	l.enterFn, l.runFn = lease.Counted(l.enter, l.exit), l.run
	l.closing = l.life.Closing().Done()
	l.subs = newSubs(l)
	return l
}

// checkClients reports a set of clients that Redlock cannot use, and names
// each node for error messages.
func (l *Locker) checkClients() error {
	n := len(l.clients)
	var errs []error
	if n < 3 || n%2 == 0 {
		errs = append(errs, fmt.Errorf("redlock: need an odd number of at least 3 independent nodes, got %d (a majority of an even number tolerates no more failures than one node fewer)", n))
	}
	seen := map[string]int{}
	for i, c := range l.clients {
		l.addrs[i] = fmt.Sprintf("node %d", i+1)
		if isNil(c) {
			errs = append(errs, fmt.Errorf("redlock: node %d: nil client", i+1))
			continue
		}
		switch c := c.(type) {
		case *goredis.ClusterClient:
			errs = append(errs, fmt.Errorf("redlock: node %d: a *goredis.ClusterClient is not an independent node (use the redis package's Locker for a Cluster)", i+1))
		case *goredis.Ring:
			errs = append(errs, fmt.Errorf("redlock: node %d: a *goredis.Ring is not an independent node (it remaps keys to other shards when one fails)", i+1))
		case *goredis.Client:
			if !c.Options().ContextTimeoutEnabled {
				errs = append(errs, fmt.Errorf("redlock: node %d: the client has ContextTimeoutEnabled off: the node timeout would not reach its socket, and every round would wait for a node that stopped answering until the client's ReadTimeout; set goredis.Options.ContextTimeoutEnabled (or FailoverOptions') to true", i+1))
			}
			addr := c.Options().Addr
			if addr == failoverAddr {
				// go-redis's placeholder for every NewFailoverClient: the
				// master's address is known only once the Sentinels tell.
				// Clients of different masters are different servers.
				l.addrs[i] = fmt.Sprintf("node %d (Sentinel failover)", i+1)
				continue
			}
			l.addrs[i] = fmt.Sprintf("node %d (%s)", i+1, addr)
			if j, dup := seen[addr]; dup && addr != "" {
				errs = append(errs, fmt.Errorf("%w: redlock: nodes %d and %d are the same server %s: a majority must be of distinct servers", locker.ErrUnsafeConfig, j+1, i+1, addr))
			}
			seen[addr] = i
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", locker.ErrInvalidOption, errors.Join(errs...))
	}
	return nil
}

// failoverAddr is the Addr that go-redis gives the Options of every client
// made by NewFailoverClient, whatever its master.
const failoverAddr = "FailoverClient"

// isNil reports a nil client, including a typed nil pointer in the
// interface (a (*goredis.Client)(nil)), whose methods would panic.
func isNil(c goredis.UniversalClient) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
}

// Err reports what New found wrong with the clients or the options (an
// error wrapping locker.ErrInvalidOption), or nil, so that a program can
// fail at start-up instead of at its first lock.
func (l *Locker) Err() error { return l.life.ConfigError() }

// Nodes returns the number of nodes and the majority an acquisition needs.
func (l *Locker) Nodes() (n, quorum int) { return len(l.clients), l.quorum }

// keys are the Redis names of one lock, the same on every node.
type keys struct {
	lock    string // the holder's owner token; expires with the lease
	fence   string // the node's counter for the key; never expires
	channel string // Pub/Sub channel on which releases are announced
	// released holds the owner tokens of the recent releases and
	// clean-ups (see the mutex's release in scripts.go).
	released string

	// The lock families (families.go): kind is mutexLock for the mutex,
	// whose names are those above, and whose queue (":q", ":qx") is under
	// base, as a family's names all are (see famscripts.go); n is a
	// semaphore's limit. lock is the mutex's or a writer's key, or a
	// permit's slot key once granted, and "" for a reader.
	kind lockKind
	base string
	n    int
}

// keysFor encodes a user key injectively, as the redis package does:
// base64url of its bytes (no braces, no ':') inside braces after the prefix.
func (l *Locker) keysFor(key string) keys {
	base := l.cfg.Prefix + "{" + base64.RawURLEncoding.EncodeToString([]byte(key)) + "}"
	return keys{lock: base + ":lock", fence: base + ":fence", channel: base + ":released", released: base + releases.Suffix, base: base}
}

// KeyNames returns the names under which the Locker keeps key on every
// node: the lock (a string holding the holder's owner token, expiring with
// the lease), the node's fencing counter (an integer that never expires)
// and the Pub/Sub channel on which releases are announced. (A fourth key,
// the name of lock with ":lock" replaced by ":released-by:", followed by an
// owner token, is the record of that owner's release, for 15 seconds, so that a release retried by go-redis is recognised, and a
// late acquire request of a round that gave up is refused. The waiters'
// queue is beside it: ":q", a sorted set of waiter ids scored by ticket,
// and ":qx", their entries' leases; see "Waiting".) It is for operators
// and tests. Never delete or lower a fencing counter: tokens could go back
// (see "Fencing tokens" in the package documentation).
func (l *Locker) KeyNames(key string) (lock, fence, channel string) {
	k := l.keysFor(key)
	return k.lock, k.fence, k.channel
}

// TryAcquire makes one Redlock round for key. When other holders have the
// key on a majority of the nodes the error wraps locker.ErrNotAcquired;
// when the round failed for another reason (nodes unreachable, a split
// between contenders, too little validity left) it wraps ErrNoQuorum.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "try-acquire", key, opts, false))
}

// Acquire takes key, waiting as long as ctx allows while another holder has
// it. It gives up with an error wrapping ErrNoQuorum when a majority of the
// nodes cannot be reached; other failed rounds (a split vote, a node that
// answered too slowly) are retried after a jittered back-off.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return backend.AsHandle(l.acquire(ctx, "acquire", key, opts, true))
}

// acquire is Acquire (wait) and TryAcquire past admission: ctx, from
// Life.Enter, also ends when Close begins.
func (l *Locker) acquire(ctx context.Context, op, key string, opts []locker.Option, wait bool) (*Handle, error) {
	ctx, done, err := l.life.Enter(ctx, op, key)
	if err != nil {
		return nil, err
	}
	defer done()
	tm, err := l.cfg.lockTiming(opts)
	if err != nil {
		return nil, backend.KeyError(op, key, err)
	}
	k := l.keysFor(key)
	if !wait {
		h, err := l.try(ctx, key, k, tm)
		return h, backend.KeyError(op, key, err)
	}
	h, err := l.famWait(ctx, key, k, tm)
	return h, backend.KeyError(op, key, err)
}

// enter counts a call that Life.Enter did not admit (a Handle's Release,
// a loss report's clean-up), unless Close has begun; exit ends it.
func (l *Locker) enter() bool { return l.life.Begin() }

func (l *Locker) exit() { l.life.End() }

// run runs f as an active call, unless Close has begun (then f does not
// run and run returns false: Close ends the handles itself). It is the Go
// hook of the lease keeper.
func (l *Locker) run(f func()) bool { return l.life.Call(f) }

// register holds h for Close (false once Close has begun); unregister
// forgets it, released or lost.
func (l *Locker) register(h *Handle) bool { return l.life.Hold(h) }

func (l *Locker) unregister(h *Handle) { l.life.Drop(h) }

// closeGrace is how long Close waits, after releasing the held locks, for
// requests still in flight. A request to a healthy node ends within a round
// trip; one to a node that stopped answering ends at its deadline (its node
// timeout, which reaches the socket with ContextTimeoutEnabled), and Close
// does not wait for that: the goroutine may outlive Close until then, with
// no effect but deleting what it may have taken.
const closeGrace = 250 * time.Millisecond

// Close releases every lock the Locker holds (on every node, in parallel;
// their Handles report locker.ErrReleasedByClose, or a loss when a majority
// could not be told), ends every waiting or in-flight call with
// locker.ErrClosed and stops the Pub/Sub connections. It closes the clients
// only when the Locker was opened from a URL.
//
// Close is bounded: it waits at most locker.ReleaseTimeout for the release
// of the held locks, then at most 250ms for calls and goroutines in flight.
// What may outlive it, with caller-owned clients (New): a request to a node
// that stopped answering, until its node timeout, and a Pub/Sub command or
// reconnect to one, until the node timeout plus up to 1s for dialling (on
// the socket when the client has ContextTimeoutEnabled); a request has no
// effect then but deleting what it may have taken. When the Locker owns the clients
// (Open), Close closes them, which ends those requests, and waits for them:
// nothing of the Locker outlives Close. A second Close returns nil.
func (l *Locker) Close() error {
	// The Pub/Sub connections go first: their goroutines end now rather
	// than at the grace, and a waiter falls back on its timer until Close
	// ends its wait a moment later.
	l.subs.close()
	return l.life.Close(backend.Closer[*Handle]{
		Release:  l.releaseAll,
		Grace:    closeGrace,
		Shutdown: l.closeClients,
		Wait:     l.ownClients,
	})
}

// releaseAll is Close's release of the locks still held: every one on
// every node in parallel, at most locker.ReleaseTimeout in all.
func (l *Locker) releaseAll(held []*Handle) error {
	ctx, cancel := context.WithTimeout(context.Background(), locker.ReleaseTimeout)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(held))
	for i, h := range held {
		wg.Add(1)
		go func() { // joined below
			defer wg.Done()
			errs[i] = h.releaseByClose(ctx)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// closeClients closes the clients when the Locker owns them (Open), and
// every connection they made, also those still in a handshake.
func (l *Locker) closeClients() error {
	if !l.ownClients {
		return nil
	}
	var errs []error
	for _, c := range l.clients {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	if l.conns != nil {
		l.conns.closeAll()
	}
	return errors.Join(errs...)
}
