package zookeeper

import (
	"context"
	"errors"
	"slices"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// contend waits until the node c made is the lowest in dir (or, without
// wait, checks once) and returns the Handle. A reader's node (reader)
// waits only until no write node is before it: the recipe below, with the
// write nodes before its own standing for all the nodes before it.
//
// It lists the directory and watches the node just before its own. A node
// created later always has a higher sequence than ours (the sequence is
// the directory's child version, which only grows while our node keeps
// the directory alive), so the nodes before ours can only go, never come.
// When the watched node goes and it was the only one before ours, the lock
// is ours with no further request (the handoff to the head of the queue):
// for that the contender also watches its own node, so that its own
// deletion (events come in transaction order) is not missed. Otherwise
// the directory is listed again: the node that went was most likely the
// holder, and the others before it are gone too.
func (s *session) contend(ctx context.Context, key, dir string, c createdNode, wait, reader bool) (*Handle, error) {
	q := &place{s: s, ctx: ctx, key: key, dir: dir, node: c.node, name: c.node[len(dir)+1:], wait: wait, reader: reader}
	if c.dir != nil {
		q.czxid, q.owner, q.known = c.dir.Mzxid, c.sid, true
	}
	return q.run()
}

// place is one contender's place in the queue of a lock directory: what it
// knows of the nodes before its own, and the watches it waits on. contend
// makes one per node and runs it; its methods are the steps of the wait.
//
// Invariants, between steps:
//   - lower is the nodes before ours, by sequence, as last seen. Nodes
//     before ours only go, never come (see contend), so lower holds every
//     node still before ours, and maybe some that went unseen.
//   - listed: lower is up to date but for deletions (a listing, shortened
//     by the deletions seen since). fresh: lower is a listing, not
//     shortened since. fresh implies listed; !listed means list again
//     before any wait or handoff.
//   - known: czxid and owner are our node's (from the create's multi, or
//     from the GetW on an adopted node, which sets own too).
//   - pred and pp, when not nil, are the shared watches on the nodes that
//     were the last and the next-to-last of lower when set; arm checks them
//     against lower, by path, before every wait.
//   - own, when not nil, is the watch on our own node, set at connection
//     generation ownGen. emptiedGen is the generation of the news (a
//     watch's event, or a GetW's answer) that last shortened lower.
//   - A handoff without a listing (lower emptied by news, !fresh) trusts
//     that our own node's deletion would have come first: only with own
//     set, and ownGen, emptiedGen and the connection's generation all the
//     same (events come in transaction order only within one connection:
//     see connGen). Otherwise the directory is listed again.
//   - After a reconnect (retry) every watch is dropped and set afresh,
//     and the directory listed again.
type place struct {
	s                    *session
	ctx                  context.Context
	key, dir, node, name string // name: node's, in dir
	wait                 bool   // false: TryAcquire, one look
	// reader: the node is a reader's of a reader-writer lock, which waits
	// for the write nodes before its own only: lower holds those, and pp
	// is not watched (the writer before the last one going does not mean
	// that one holds: readers may be between them). A writer's node waits
	// for every node before it, as a mutex's does, and watches pp unless
	// it and the predecessor are both readers (see arm).
	reader bool

	czxid, owner int64 // our node's, once known
	known        bool

	lower         []lockNode
	listed, fresh bool

	own                <-chan zk.Event
	ownGen, emptiedGen uint64
	pred, pp           *nodeWatch
}

// run waits for the lock (or, without wait, looks once).
func (q *place) run() (*Handle, error) {
	for {
		if !q.listed || !q.known {
			if err := q.list(); err != nil {
				if again, err := q.retry(err); !again {
					return nil, err
				}
				continue
			}
		}
		if len(q.lower) == 0 {
			ours, err := q.atHead()
			if err != nil {
				return nil, err
			}
			if ours {
				return q.s.hold(q.key, q.node, q.czxid, q.owner)
			}
			continue
		}
		if !q.wait {
			return nil, locker.ErrNotAcquired
		}
		if err := q.arm(); err != nil {
			if again, err := q.retry(err); !again {
				return nil, err
			}
			continue
		}
		if q.pred == nil || !q.listed {
			continue
		}
		if err := q.await(); err != nil {
			return nil, err
		}
	}
}

// retry reports whether err, from a request on the way, is a broken
// connection to wait out (a waiting Acquire) rather than a failure.
func (q *place) retry(err error) (bool, error) {
	s := q.s
	if !q.wait || !isConnErr(err) || q.ctx.Err() != nil || s.l.life.IsClosing() {
		return false, err
	}
	if _, _, err := s.awaitSession(q.ctx); err != nil {
		return false, err
	}
	// go-zookeeper sets the watches again on the new connection, in no
	// particular order: events on the old ones no longer come in
	// transaction order. Set them afresh.
	q.listed = false
	s.dropWatch(q.pred)
	s.dropWatch(q.pp)
	q.own, q.pred, q.pp = nil, nil, nil
	return true, nil
}

// list lists the directory and makes lower the nodes before ours. For an
// adopted node (!known) it also reads our node's stat, with a watch on it:
// both requests go out back to back on the one connection.
func (q *place) list() error {
	s := q.s
	var (
		kids            []string
		ownErr, kidsErr error
		ch              <-chan zk.Event
		st              *zk.Stat
		g               = s.connGen()
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
				var err error
				_, st, ch, err = s.conn.GetW(q.node)
				return err
			}, nil)
		})
		kidsErr = s.l.call(q.ctx, children, nil)
		<-done
	} else {
		kidsErr = s.l.call(q.ctx, children, nil)
	}
	if errors.Is(ownErr, zk.ErrNoNode) || errors.Is(kidsErr, zk.ErrNoNode) {
		return errNodeGone
	}
	if err := errors.Join(ownErr, kidsErr); err != nil {
		return err
	}
	if !q.known {
		q.own, q.czxid, q.owner, q.known = ch, st.Czxid, st.EphemeralOwner, true
		q.ownGen = g
	}
	nodes, idx, err := s.ownPlace(q.dir, q.name, kids)
	if err != nil {
		return err
	}
	q.lower, q.listed, q.fresh = nodes[:idx], true, true
	if q.reader {
		// A reader waits for the writers before it only.
		q.lower = slices.DeleteFunc(q.lower, func(n lockNode) bool { return n.kind != kindWrite })
	}
	if len(q.lower) > 0 {
		s.l.hot.mark(q.dir)
	}
	return nil
}

// ownPlace parses a listing of dir and returns its nodes in sequence order
// and the index of ours (named name), or errNodeGone when ours is missing.
//
// A node of ours that is not the one we contend with would block the
// queue: one before ours would block us for good, one after ours everyone
// once we are done, until the session ends. A create retried after a lost
// answer makes one when its first attempt was applied after all but the
// listing that looked for it did not show it yet (on an ensemble, a server
// behind the leader answered it). ownPlace deletes it.
func (s *session) ownPlace(dir, name string, kids []string) ([]lockNode, int, error) {
	nodes := sortNodes(kids)
	idx := slices.IndexFunc(nodes, func(n lockNode) bool { return n.name == name })
	if idx < 0 {
		return nil, 0, errNodeGone
	}
	for i, n := range nodes {
		if i != idx && n.guid == nodes[idx].guid {
			s.deleteDetached(dir + "/" + n.name)
		}
	}
	return nodes, idx, nil
}

// atHead, with no node left before ours, reports whether the lock is ours
// now; false means list again first (listed is cleared). It fails with
// errNodeGone when our own node's deletion has come.
func (q *place) atHead() (bool, error) {
	if q.own != nil {
		select {
		case ev := <-q.own:
			if nodeEnded(ev) {
				return false, errNodeGone
			}
			q.own = nil // data changed: the monitor watches again
		default:
		}
	} else if !q.fresh {
		// Without a watch on our own node its deletion could have gone
		// unseen: list again to be sure.
		q.listed = false
		return false, nil
	}
	if !q.fresh && (q.ownGen != q.s.connGen() || q.emptiedGen != q.ownGen) {
		// The connection changed since the watches were set: the deletion
		// of our own node may come after the news of the predecessor's,
		// though it happened first. List again.
		q.listed = false
		return false, nil
	}
	return true, nil
}

// arm sets the watches the wait needs that are not set yet: on the
// predecessor, and on the node before it too: when that one goes, the
// predecessor most likely holds the lock now, and a listing then (while
// it holds) lets our own turn come with no request at all. Each node so
// has at most two watchers, whatever the length of the queue: a release
// wakes the next holder and the one after it, never the rest. With one
// node before ours, it watches our own node too (see atHead).
func (q *place) arm() error {
	s := q.s
	pred := q.dir + "/" + q.lower[len(q.lower)-1].name
	pp := ""
	if n := len(q.lower); n >= 2 && !q.reader && (q.lower[n-1].kind != kindRead || q.lower[n-2].kind != kindRead) {
		// Not for a writer behind two readers: a reader waits for no
		// reader, so the one before the predecessor going tells nothing
		// of the predecessor's turn.
		pp = q.dir + "/" + q.lower[n-2].name
	}
	var reqs []*watchReq
	var ownReq, predReq, ppReq *watchReq
	if len(q.lower) == 1 && q.own == nil {
		ownReq = &watchReq{path: q.node}
		reqs = append(reqs, ownReq)
	}
	if pred == q.pp.on() && pred != q.pred.on() {
		// The predecessor gave up: the node before it, watched already,
		// is the predecessor now.
		q.pred, q.pp = q.pp, nil
	}
	if pp == "" {
		q.pp = nil // a watch left on a node not worth watching now
	}
	if pred != q.pred.on() {
		predReq = &watchReq{path: pred, shared: true}
		reqs = append(reqs, predReq)
	}
	if pp != "" && pp != q.pp.on() {
		ppReq = &watchReq{path: pp, shared: true}
		reqs = append(reqs, ppReq)
	}
	reqGen := s.connGen()
	s.watchAll(q.ctx, reqs)
	var errs []error
	if ownReq != nil {
		switch {
		case errors.Is(ownReq.err, zk.ErrNoNode):
			return errNodeGone
		case ownReq.err == nil:
			q.own, q.ownGen = ownReq.ch, reqGen
		default:
			errs = append(errs, ownReq.err)
		}
	}
	if predReq != nil {
		q.pred = predReq.w // nil unless set
		switch {
		case errors.Is(predReq.err, zk.ErrNoNode):
			q.predGone(reqGen)
		case predReq.err != nil:
			errs = append(errs, predReq.err)
		}
	}
	if ppReq != nil {
		q.pp = ppReq.w // nil unless set
		switch {
		case errors.Is(ppReq.err, zk.ErrNoNode):
			q.listed = false
		case ppReq.err != nil:
			errs = append(errs, ppReq.err)
		}
	}
	return errors.Join(errs...)
}

// predGone shortens lower by the predecessor, whose deletion came as news
// at connection generation gen (0: not known to be the current one). With
// nodes left before it, the one that went gave up waiting (the holder goes
// first, seen on the other watch) or the listing is behind: list again.
func (q *place) predGone(gen uint64) {
	q.lower, q.fresh, q.emptiedGen = q.lower[:len(q.lower)-1], false, gen
	q.listed = len(q.lower) == 0
}

// await waits for the next news: a watch fired, or ctx ended.
func (q *place) await() error {
	if len(q.lower) < 2 {
		q.pp = nil // a watch left on a node no longer before the predecessor
	}
	select {
	case <-q.pred.fired():
		ev, gen := q.pred.ev, q.pred.gen
		if q.s.connGen() != gen {
			gen = 0 // read after a reconnect: maybe a re-armed watch's
		}
		q.pred = nil
		switch ev.Type {
		case zk.EventNodeDeleted:
			q.predGone(gen)
		case zk.EventNotWatching:
			q.listed = false
		}
		// Data changed: watch the same node again.
	case <-q.pp.fired():
		ev := q.pp.ev
		q.pp = nil
		if nodeEnded(ev) {
			q.listed = false
		}
	case ev := <-q.own:
		if nodeEnded(ev) {
			return errNodeGone
		}
		q.own = nil
	case <-q.ctx.Done():
		return backend.ContextError(q.ctx)
	}
	return nil
}

// nodeEnded reports a watch's event that says its node is gone, or no
// longer watched.
func nodeEnded(ev zk.Event) bool {
	return ev.Type == zk.EventNodeDeleted || ev.Type == zk.EventNotWatching
}
