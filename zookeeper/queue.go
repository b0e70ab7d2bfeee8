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
// wait, checks once) and returns the Handle.
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
func (l *Locker) contend(ctx context.Context, key, dir string, c createdNode, wait bool) (*Handle, error) {
	node := c.node
	name := node[len(dir)+1:]
	var (
		own          <-chan zk.Event // watch on our own node, when set
		czxid, owner int64           // our node's, once known
		known        bool
		lower        []lockNode // the nodes before ours, by sequence, as last seen
		listed       bool       // lower is up to date but for deletions
		fresh        bool       // lower is a listing, not shortened by events since
		// The watches on the predecessor and the node before it, and
		// which nodes they are on ("": none set).
		pch, ppch          *nodeWatch
		armedPred, armedPP string
		// The connection generations of the watch on our own node and of
		// the news that emptied lower (a watch's event, or a GetW's
		// answer): a handoff with no request trusts their order, which
		// holds only within one connection (see connGen).
		ownGen, emptiedGen uint64
	)
	if c.dir != nil {
		czxid, owner, known = c.dir.Mzxid, c.sid, true
	}
	// retry reports whether err, from a request on the way, is a broken
	// connection to wait out (a waiting Acquire) rather than a failure.
	retry := func(err error) (bool, error) {
		if wait && isConnErr(err) && ctx.Err() == nil && !l.life.IsClosing() {
			if _, _, err := l.awaitSession(ctx); err != nil {
				return false, err
			}
			// go-zookeeper sets the watches again on the new connection,
			// in no particular order: events on the old ones no longer
			// come in transaction order. Set them afresh.
			listed = false
			l.dropWatch(pch)
			l.dropWatch(ppch)
			own, pch, ppch, armedPred, armedPP = nil, nil, nil, "", ""
			return true, nil
		}
		return false, err
	}
	for {
		if !listed || !known {
			var (
				kids    []string
				ownErr  error
				ch      <-chan zk.Event
				st      *zk.Stat
				kidsErr error
				g       = l.connGen()
			)
			if !known {
				// An adopted node: its stat comes with the watch on it.
				// Both requests go out back to back on the one connection.
				done := make(chan struct{})
				l.spawn(func() {
					defer close(done)
					ownErr = l.call(ctx, func() error {
						var err error
						_, st, ch, err = l.conn.GetW(node)
						return err
					}, nil)
				})
				kidsErr = l.call(ctx, func() error {
					k, _, err := l.conn.Children(dir)
					kids = k
					return err
				}, nil)
				<-done
			} else {
				kidsErr = l.call(ctx, func() error {
					k, _, err := l.conn.Children(dir)
					kids = k
					return err
				}, nil)
			}
			if errors.Is(ownErr, zk.ErrNoNode) || errors.Is(kidsErr, zk.ErrNoNode) {
				return nil, errNodeGone
			}
			if err := errors.Join(ownErr, kidsErr); err != nil {
				if again, err := retry(err); again {
					continue
				} else {
					return nil, err
				}
			}
			if !known {
				own, czxid, owner, known = ch, st.Czxid, st.EphemeralOwner, true
				ownGen = g
			}
			nodes := sortNodes(kids)
			idx := slices.IndexFunc(nodes, func(n lockNode) bool { return n.name == name })
			if idx < 0 {
				return nil, errNodeGone
			}
			// A node of ours that is not the one we contend with would
			// block the queue: one before ours would block us for good,
			// one after ours everyone once we are done, until the session
			// ends. A create retried after a lost answer makes one when
			// its first attempt was applied after all but the listing
			// that looked for it did not show it yet (on an ensemble, a
			// server behind the leader answered it). Delete it.
			for i, n := range nodes {
				if i != idx && n.guid == nodes[idx].guid {
					l.deleteDetached(dir + "/" + n.name)
				}
			}
			lower, listed, fresh = nodes[:idx], true, true
			if len(lower) > 0 {
				l.hot.mark(dir)
			}
		}
		if len(lower) == 0 {
			if own != nil {
				select {
				case ev := <-own:
					if ev.Type == zk.EventNodeDeleted || ev.Type == zk.EventNotWatching {
						return nil, errNodeGone
					}
					own = nil // data changed: the monitor watches again
				default:
				}
			} else if !fresh {
				// Without a watch on our own node its deletion could have
				// gone unseen: list again to be sure.
				listed = false
				continue
			}
			if !fresh && (ownGen != l.connGen() || emptiedGen != ownGen) {
				// The connection changed since the watches were set: the
				// deletion of our own node may come after the news of the
				// predecessor's, though it happened first. List again.
				listed = false
				continue
			}
			return l.hold(key, node, czxid, owner, own)
		}
		if !wait {
			return nil, locker.ErrNotAcquired
		}
		// Watch the predecessor, and the node before it too: when that one
		// goes, the predecessor most likely holds the lock now, and a
		// listing then (while it holds) lets our own turn come with no
		// request at all. Each node so has at most two watchers, whatever
		// the length of the queue: a release wakes the next holder and
		// the one after it, never the rest.
		pred := dir + "/" + lower[len(lower)-1].name
		pp := ""
		if len(lower) >= 2 {
			pp = dir + "/" + lower[len(lower)-2].name
		}
		var reqs []*watchReq
		var ownReq, predReq, ppReq *watchReq
		if len(lower) == 1 && own == nil {
			ownReq = &watchReq{path: node}
			reqs = append(reqs, ownReq)
		}
		if pred == armedPP && pred != armedPred {
			// The predecessor gave up: the node before it, watched
			// already, is the predecessor now.
			pch, armedPred, ppch, armedPP = ppch, armedPP, nil, ""
		}
		if pred != armedPred {
			predReq = &watchReq{path: pred, shared: true}
			reqs = append(reqs, predReq)
		}
		if pp != "" && pp != armedPP {
			ppReq = &watchReq{path: pp, shared: true}
			reqs = append(reqs, ppReq)
		}
		reqGen := l.connGen()
		l.watchAll(ctx, reqs)
		var errs []error
		if ownReq != nil {
			switch {
			case errors.Is(ownReq.err, zk.ErrNoNode):
				return nil, errNodeGone
			case ownReq.err == nil:
				own, ownGen = ownReq.ch, reqGen
			default:
				errs = append(errs, ownReq.err)
			}
		}
		if predReq != nil {
			switch {
			case errors.Is(predReq.err, zk.ErrNoNode):
				armedPred, pch = "", nil
				lower, fresh, emptiedGen = lower[:len(lower)-1], false, reqGen
				listed = len(lower) == 0
			case predReq.err == nil:
				armedPred, pch = pred, predReq.w
			default:
				armedPred, pch = "", nil
				errs = append(errs, predReq.err)
			}
		}
		if ppReq != nil {
			switch {
			case errors.Is(ppReq.err, zk.ErrNoNode):
				armedPP, ppch = "", nil
				listed = false
			case ppReq.err == nil:
				armedPP, ppch = pp, ppReq.w
			default:
				armedPP, ppch = "", nil
				errs = append(errs, ppReq.err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			if again, err := retry(err); again {
				continue
			} else {
				return nil, err
			}
		}
		if pch == nil || !listed {
			continue
		}
		if pp == "" {
			// A watch left on a node no longer before the predecessor.
			armedPP, ppch = "", nil
		}
		select {
		case <-pch.fired():
			ev, evGen := pch.ev, pch.gen
			if l.connGen() != evGen {
				evGen = 0 // read after a reconnect: maybe a re-armed watch's
			}
			armedPred, pch = "", nil
			switch ev.Type {
			case zk.EventNodeDeleted:
				lower, fresh, emptiedGen = lower[:len(lower)-1], false, evGen
				// With nodes left before it, the one that went gave up
				// waiting (the holder goes first, seen on the other
				// watch) or the listing is behind: list again.
				listed = len(lower) == 0
			case zk.EventNotWatching:
				listed = false
			}
			// Data changed: watch the same node again.
		case <-ppch.fired():
			ev := ppch.ev
			armedPP, ppch = "", nil
			if ev.Type == zk.EventNodeDeleted || ev.Type == zk.EventNotWatching {
				listed = false
			}
		case ev := <-own:
			if ev.Type == zk.EventNodeDeleted || ev.Type == zk.EventNotWatching {
				return nil, errNodeGone
			}
			own = nil
		case <-ctx.Done():
			return nil, backend.ContextError(ctx)
		}
	}
}
