package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// A semaphore of n is a directory of sequential nodes, as a mutex is: the n
// lowest hold a permit each, the others wait in sequence order. A node
// before ours can only go, never come (see contend), so once a node is
// among the n lowest it stays there until it goes: holding is stable.
//
// Whose going can change a waiter's turn? Any node before it: holders
// leave in any order. But only one waiter can be next: the first, the
// (n+1)-th node, which so watches all n holders; any one going lets it in.
// A waiter further back cannot get in before the waiter just before it
// (its predecessor) does, and becomes the first one at the moment its
// predecessor gets in or goes. So it watches its predecessor only: for
// its deletion, and for a write to its data, which a node that got in
// makes (relay) when its listing shows nodes after its own, any of which
// may have taken it for a waiter. A holder going so wakes the first
// waiter only, which wakes the next one by that write: one waiter at a
// time, never a herd, and each waiter watches only nodes that can change
// its turn.
//
// The limit n is in every node's name ("-sem-<n>-"), so a listing shows
// the limit of every holder and waiter: a node whose limit differs from
// that of any node before it is refused (locker.ErrLimitMismatch) and
// deleted, so the first limit in the queue is the key's, and a second one
// is never obeyed.

// signalData is what a permit's node is set to when it gets in with nodes
// after it (see relay); the write, not the value, wakes its successor.
var signalData = []byte("held")

// contendPermit waits until the node c made is among the n lowest in dir
// (or, without wait, checks once) and returns the Handle.
func (s *session) contendPermit(ctx context.Context, key, dir string, c createdNode, n int, wait bool) (*Handle, error) {
	q := &permitWait{s: s, ctx: ctx, key: key, dir: dir, node: c.node, name: c.node[len(dir)+1:], n: n, wait: wait}
	if c.dir != nil {
		q.czxid, q.owner, q.known = c.dir.Mzxid, c.sid, true
	}
	return q.run()
}

// permitWait is one contender's wait for a permit.
type permitWait struct {
	s                    *session
	ctx                  context.Context
	key, dir, node, name string // name: node's, in dir
	n                    int
	wait                 bool // false: TryAcquire, one look

	czxid, owner int64 // our node's, once known
	known        bool
}

// run lists the directory, and until the node is among the n lowest, sets
// the watches its place in the queue needs, waits for one to fire, and
// lists again.
func (q *permitWait) run() (*Handle, error) {
	for {
		nodes, idx, err := q.list()
		if err != nil {
			if again, err := q.retry(err); !again {
				return nil, err
			}
			continue
		}
		if len(nodes) > 1 {
			q.s.l.hot.mark(q.dir)
		}
		for _, nd := range nodes[:idx] {
			if nd.kind != kindPermit || nd.limit != q.n {
				return nil, fmt.Errorf("%w: the key is a semaphore of %d (a permit or a waiter of that limit came first: %s), asked for %d", locker.ErrLimitMismatch, nd.limit, nd.name, q.n)
			}
		}
		if idx < q.n {
			h, err := q.s.hold(q.key, q.node, q.czxid, q.owner)
			if err == nil && idx < len(nodes)-1 {
				q.s.relay(h)
			}
			return h, err
		}
		if !q.wait {
			return nil, locker.ErrNotAcquired
		}
		// The first waiter watches the n holders; a waiter further back,
		// its predecessor.
		watch := nodes[idx-1 : idx]
		if idx == q.n {
			watch = nodes[:idx]
		}
		ws, again, err := q.arm(watch, idx > q.n)
		if err != nil {
			if again, err := q.retry(err); !again {
				return nil, err
			}
			continue
		}
		if again {
			continue
		}
		if err := q.await(ws); err != nil {
			return nil, err
		}
	}
}

// list lists the directory and returns its nodes and the index of ours.
// For a node whose czxid is not known yet (adopted after a lost answer, or
// made by a plain create) it also reads our node's stat: both requests go
// out back to back on the one connection.
func (q *permitWait) list() ([]lockNode, int, error) {
	s := q.s
	var (
		kids            []string
		st              *zk.Stat
		ownErr, kidsErr error
	)
	children := func() error {
		k, _, err := s.conn.Children(q.dir)
		kids = k
		return err
	}
	if !q.known {
		done := make(chan struct{})
		s.l.spawn(func() {
			defer close(done)
			ownErr = s.l.call(q.ctx, func() error {
				ok, stat, err := s.conn.Exists(q.node)
				if err == nil && !ok {
					err = zk.ErrNoNode
				}
				st = stat
				return err
			}, nil)
		})
		kidsErr = s.l.call(q.ctx, children, nil)
		<-done
	} else {
		kidsErr = s.l.call(q.ctx, children, nil)
	}
	if errors.Is(ownErr, zk.ErrNoNode) || errors.Is(kidsErr, zk.ErrNoNode) {
		return nil, 0, errNodeGone
	}
	if err := errors.Join(ownErr, kidsErr); err != nil {
		return nil, 0, err
	}
	if !q.known {
		q.czxid, q.owner, q.known = st.Czxid, st.EphemeralOwner, true
	}
	return s.ownPlace(q.dir, q.name, kids)
}

// relay writes the data of h's node, which wakes the waiter after it, if
// it watches it (see the recipe above). It runs in the background, off the
// new holder's way (a write costs the server a flush of its log), and is
// repeated through disconnections until the server applies it, or the node
// is gone: its deletion (a release, the end of the session) wakes that
// waiter too. A permit whose write the server refuses (an ACL without
// WRITE: see WithACL) would leave that waiter asleep for as long as it is
// held, so it is given up: lost, its node deleted.
//
// The holder's watch on its own node (see Handle.arm) is set once the
// write is done, so that the write does not fire it.
func (s *session) relay(h *Handle) {
	h.stopWatch()
	s.l.life.Go(func() {
		defer h.arm()
		ctx, cancel := context.WithCancel(s.l.life.Closing())
		defer cancel()
		stop := context.AfterFunc(doneContext{h.state.Done()}, cancel)
		defer stop()
		for {
			err := s.l.call(ctx, func() error {
				_, err := s.conn.Set(h.node, signalData, -1)
				return err
			}, nil)
			switch {
			case err == nil, errors.Is(err, zk.ErrNoNode), ctx.Err() != nil:
				return
			case isConnErr(err):
				if id, _, err := s.awaitSession(ctx); err != nil || id != h.sid {
					return // the session ended, and the node with it
				}
			default:
				why := fmt.Sprintf("the permit could not wake the waiter after it (the write of its node was refused: %v); a semaphore needs WRITE on its nodes", err)
				s.l.logf("zookeeper: %s: %s", h.node, why)
				if h.state.End(h.lostErr(why)) {
					s.l.life.Drop(h)
					s.deleteDetached(h.node)
				}
				return
			}
		}
	})
}

// arm sets (or joins) the shared watches on the nodes of watch. again
// reports that the directory must be listed again at once: a node watched
// is gone already, or (pred: watch is our predecessor) it has written its
// data, so it got in after that listing.
func (q *permitWait) arm(watch []lockNode, pred bool) ([]*nodeWatch, bool, error) {
	reqs := make([]*watchReq, len(watch))
	for i, nd := range watch {
		reqs[i] = &watchReq{path: q.dir + "/" + nd.name, shared: true}
	}
	q.s.watchAll(q.ctx, reqs)
	ws := make([]*nodeWatch, 0, len(reqs))
	again := false
	var errs []error
	for _, r := range reqs {
		switch {
		case errors.Is(r.err, zk.ErrNoNode):
			again = true
		case r.err != nil:
			errs = append(errs, r.err)
		default:
			ws = append(ws, r.w)
			if pred && r.w.version != 0 {
				again = true
			}
		}
	}
	return ws, again, errors.Join(errs...)
}

// await waits until one of ws fires, or ctx ends.
func (q *permitWait) await(ws []*nodeWatch) error {
	cases := make([]reflect.SelectCase, 0, len(ws)+1)
	cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(q.ctx.Done())})
	for _, w := range ws {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.fired())})
	}
	if i, _, _ := reflect.Select(cases); i == 0 {
		return backend.ContextError(q.ctx)
	}
	return nil
}

// retry reports whether err, from a request on the way, is a broken
// connection to wait out (a waiting Acquire) rather than a failure.
func (q *permitWait) retry(err error) (bool, error) {
	s := q.s
	if !q.wait || !isConnErr(err) || q.ctx.Err() != nil || s.l.life.IsClosing() {
		return false, err
	}
	if _, _, err := s.awaitSession(q.ctx); err != nil {
		return false, err
	}
	return true, nil
}
