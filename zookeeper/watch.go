package zookeeper

import (
	"context"
	"sync"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// watchReq is one GetW of watchAll: its path and whether the watch is
// shared (see nodeWatch), then its watch or error.
type watchReq struct {
	path   string
	shared bool
	ch     <-chan zk.Event // !shared
	w      *nodeWatch      // shared
	err    error
}

// watchAll sets the watches of reqs (GetW, not ExistsW: on a node already
// gone it sets no watch, where ExistsW would leave one behind for good),
// the requests going out back to back.
func (s *session) watchAll(ctx context.Context, reqs []*watchReq) {
	var wg sync.WaitGroup
	for i, r := range reqs {
		get := func() {
			if r.shared {
				r.w, r.err = s.watchNode(ctx, r.path)
				return
			}
			r.err = s.l.call(ctx, func() error {
				var err error
				_, _, r.ch, err = s.conn.GetW(r.path)
				return err
			}, nil)
		}
		if i == len(reqs)-1 {
			get()
			break
		}
		wg.Add(1)
		s.l.spawn(func() {
			defer wg.Done()
			get()
		})
	}
	wg.Wait()
}

// nodeWatch is a data watch on another contender's node, shared by the
// Locker's waiters. go-zookeeper cannot remove a watch, and keeps the
// channel of each GetW until the node changes, so a waiter that gives up
// (an Acquire with a timeout, tried again and again while one holder keeps
// the key) would leave one channel behind per attempt; shared, there is one
// per node watched, however many attempts.
//
// The watch enters the Locker's table before its GetW is sent, and one
// goroutine sends the GetW, waits for the event, records it, takes the
// watch out of the table (the next waiter on the node sets a new one) and
// closes done. Waiters wait for the GetW's answer as long as their context
// allows; one that gives up leaves the request to finish for the next. The
// goroutine ends with the event, when the connection closes, or when
// Close begins (no waiter is left then; the GetW itself, unanswered, is
// waited for as Close waits for every request). A new connection empties
// the table (see onSession).
type nodeWatch struct {
	path string
	gen  uint64        // the connection generation before its GetW went out
	set  chan struct{} // closed once the GetW was answered
	err  error         // the GetW's error, set before set is closed
	// version is the node's data version the GetW read (set before set
	// is closed): above 0 once the node's data was written, which a
	// semaphore's permit does when it gets in (see signal).
	version int32
	done    chan struct{} // closed once the watch fired
	ev      zk.Event      // set before done is closed
}

// fired returns the channel closed once the watch fired; nil (never ready)
// for no watch.
func (w *nodeWatch) fired() <-chan struct{} {
	if w == nil {
		return nil
	}
	return w.done
}

// on returns the path w watches; "" for no watch.
func (w *nodeWatch) on() string {
	if w == nil {
		return ""
	}
	return w.path
}

// watchNode returns the Locker's watch on path, setting one (GetW) if there
// is none, once the server has answered the GetW. A node gone makes it
// fail with zk.ErrNoNode.
func (s *session) watchNode(ctx context.Context, path string) (*nodeWatch, error) {
	s.wmu.Lock()
	w := s.watches[path]
	if g := s.connGen(); w == nil || w.gen != g {
		// None, or one set on an older connection (the supervisor empties
		// the table on a new one, maybe not yet): set a new one.
		w = &nodeWatch{path: path, gen: g, set: make(chan struct{}), done: make(chan struct{})}
		s.watches[path] = w
		if !s.l.life.Go(func() { s.runWatch(w) }) {
			// Close has stopped waiting: no GetW goes out.
			delete(s.watches, path)
			w.err = locker.ErrClosed
			close(w.set)
		}
	}
	s.wmu.Unlock()
	select {
	case <-w.set:
		if w.err != nil {
			return nil, w.err
		}
		return w, nil
	case <-ctx.Done():
		return nil, backend.ContextError(ctx)
	case <-s.l.life.Closing().Done():
		return nil, locker.ErrClosed
	}
}

// runWatch sets w (GetW) and waits for it to fire, or for Close to begin
// (no waiter is left then).
func (s *session) runWatch(w *nodeWatch) {
	_, st, ch, err := s.conn.GetW(w.path)
	if err != nil {
		w.err = err
		s.dropWatch(w)
		close(w.set)
		return
	}
	w.version = st.Version
	close(w.set)
	var ev zk.Event
	select {
	case e, ok := <-ch:
		if ev = e; !ok {
			ev = zk.Event{Type: zk.EventNotWatching, State: zk.StateDisconnected, Path: w.path, Err: zk.ErrClosing}
		}
	case <-s.l.life.Closing().Done():
		ev = zk.Event{Type: zk.EventNotWatching, State: zk.StateDisconnected, Path: w.path, Err: locker.ErrClosed}
	}
	w.ev = ev
	s.dropWatch(w)
	close(w.done)
}

// clearWatches empties the Locker's table of shared watches: later waiters
// set new ones. Those that hold one keep it.
func (s *session) clearWatches() {
	s.wmu.Lock()
	clear(s.watches)
	s.wmu.Unlock()
}

// dropWatch takes w out of the Locker's table, so that the next waiter on
// its node sets a new watch (after a reconnect, say); those that hold w
// keep it.
func (s *session) dropWatch(w *nodeWatch) {
	if w == nil {
		return
	}
	s.wmu.Lock()
	if s.watches[w.path] == w {
		delete(s.watches, w.path)
	}
	s.wmu.Unlock()
}
