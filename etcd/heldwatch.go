package etcd

import (
	"context"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// heldWatch watches the holders' keys for their deletion by anyone but
// Release or Close (an operator, a lease revoked by another client), which
// is a loss. All the watches share one gRPC Watch stream of the Locker's,
// read by one goroutine, whatever the number of locks held: clientv3's Watch
// runs goroutines per watcher (with the one waiting on its channel, three
// per held lock), which a service that locks every entity it works on would
// pay thousands of times.
//
// A holder's watch is created watchDelay after its acquisition (a lock
// released by then costs nothing) and starts at the revision after its
// key's creation, so no deletion is missed. When the stream breaks (a
// member restarts, the client moves to another member, or the member loses
// its leader: the stream requires one, see below) every watch is created
// again on a new stream from the same revision, after the pause of
// rewatch. When the server cancels one watch (its start revision was
// compacted away), the key is read instead (a linearizable read): gone, or
// created again by someone else, is a loss; still ours, the watch is
// created again from the revision of the read.
//
// The stream requires a leader (clientv3.WithRequireLeader): a member cut
// off from its peers would otherwise keep it open and never tell us that
// the majority deleted our key (an operator, an old leader revoking the
// lease: etcd #15247); it ends the stream instead, and the watches are
// created again, on whichever member the client reaches.
//
// Requests to the stream (creates and cancels) are queued and sent by a
// goroutine of the stream's, so that neither an acquisition's timer nor a
// Release ever waits for the stream (a Send blocks once the stream's flow
// control window is full, as it is behind a partition).
type heldWatch struct {
	l *Locker

	mu      sync.Mutex
	byID    map[int64]*Handle // the watched holders, by watch id (Handle.wid)
	next    int64             // the last watch id given
	out     *outbox           // the live stream's queue; nil while none is up
	running bool              // run's goroutine is on (until Close)
}

// outbox is the queue of one stream's requests, sent by its sendLoop.
type outbox struct {
	reqs []*pb.WatchRequest // under heldWatch.mu
	kick chan struct{}      // reqs has requests
}

// add watches h's key, unless h has ended or Close has begun. It starts
// the stream's goroutine at the first call.
func (w *heldWatch) add(h *Handle) {
	l := w.l
	w.mu.Lock()
	if h.wid != 0 || h.state.Ended() || h.releasing.Load() || l.life.IsClosing() {
		w.mu.Unlock()
		return
	}
	if w.byID == nil {
		w.byID = make(map[int64]*Handle)
	}
	w.next++
	h.wid = w.next
	h.wfrom = h.rev + 1
	w.byID[h.wid] = h
	start := !w.running
	w.running = true
	w.queueLocked(createReq(h))
	w.mu.Unlock()
	if start {
		if !l.life.Go(w.run) {
			w.mu.Lock()
			w.running = false
			w.mu.Unlock()
		}
	}
}

// queueLocked queues req for the live stream, if one is up; else the
// next stream creates every watch of byID anyway. Call it with mu held.
func (w *heldWatch) queueLocked(req *pb.WatchRequest) {
	if w.out == nil {
		return
	}
	w.out.reqs = append(w.out.reqs, req)
	select {
	case w.out.kick <- struct{}{}:
	default:
	}
}

// remove stops watching h's key (its lock ended).
func (w *heldWatch) remove(h *Handle) {
	w.mu.Lock()
	id := h.wid
	if id == 0 {
		w.mu.Unlock()
		return
	}
	h.wid = 0
	delete(w.byID, id)
	w.queueLocked(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{
		CancelRequest: &pb.WatchCancelRequest{WatchId: id}}})
	w.mu.Unlock()
}

func createReq(h *Handle) *pb.WatchRequest {
	return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
		Key:           []byte(h.ekey),
		StartRevision: h.wfrom,
		Filters:       []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NOPUT},
		WatchId:       h.wid,
	}}}
}

// sendLoop sends the requests queued in ob on st until it fails or ctx
// ends.
func (w *heldWatch) sendLoop(ctx context.Context, st pb.Watch_WatchClient, ob *outbox) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-ob.kick:
		}
		w.mu.Lock()
		reqs := ob.reqs
		ob.reqs = nil
		w.mu.Unlock()
		for _, req := range reqs {
			if st.Send(req) != nil {
				return // the stream broke: read sees it too
			}
		}
	}
}

// run keeps the stream up until Close begins: it opens it, creates the
// watches of every holder known, and reads it until it breaks.
func (w *heldWatch) run() {
	l := w.l
	closing := l.life.Closing()
	ctx := clientv3.WithRequireLeader(closing)
	var rw rewatch
	for {
		rw.start()
		sctx, cancel := context.WithCancel(ctx)
		st, err := pb.NewWatchClient(l.cli.ActiveConnection()).Watch(sctx)
		if err == nil {
			ob := &outbox{kick: make(chan struct{}, 1)}
			w.mu.Lock()
			w.out = ob
			for _, h := range w.byID {
				w.queueLocked(createReq(h))
			}
			w.mu.Unlock()
			if l.life.Go(func() { w.sendLoop(sctx, st, ob) }) {
				w.read(st)
			}
			w.mu.Lock()
			w.out = nil
			w.mu.Unlock()
		}
		cancel()
		if closing.Err() != nil || !rw.wait(closing) {
			return
		}
	}
}

// read handles the stream's responses until it breaks.
func (w *heldWatch) read(st pb.Watch_WatchClient) {
	for {
		resp, err := st.Recv()
		if err != nil {
			return
		}
		w.mu.Lock()
		h := w.byID[resp.WatchId]
		w.mu.Unlock()
		if h == nil {
			continue // a watch removed meanwhile, or a cancel's answer
		}
		for _, ev := range resp.Events {
			if ev.Type == mvccpb.DELETE && string(ev.Kv.Key) == h.ekey {
				w.gone(h)
				break
			}
		}
		if resp.Canceled {
			// The server ended this watch (its start revision was
			// compacted): read the key instead, off the stream's
			// goroutine.
			w.mu.Lock()
			if w.byID[resp.WatchId] == h {
				delete(w.byID, resp.WatchId)
				h.wid = 0
			}
			w.mu.Unlock()
			if !w.l.life.Go(func() { w.verify(h) }) {
				return
			}
		}
	}
}

// gone ends h: its key was deleted, by someone else unless h is releasing.
func (w *heldWatch) gone(h *Handle) {
	h.keyGone.Store(true)
	if !h.releasing.Load() {
		h.name.free() // our key is gone
		h.lose("the lock key was deleted on the server")
	}
}

// verify reads h's key after the server cancelled its watch, and watches
// it again from the read's revision if it is still h's.
func (w *heldWatch) verify(h *Handle) {
	l := w.l
	ctx, cancel := context.WithCancel(l.life.Closing())
	defer cancel()
	stop := context.AfterFunc(ctxOf(h.state.Done()), cancel)
	defer stop()
	var rw rewatch
	rw.start()
	if !rw.wait(ctx) {
		return
	}
	b := retryBackoff()
	for {
		if ctx.Err() != nil || h.state.Ended() || h.releasing.Load() {
			return
		}
		rctx, rcancel := context.WithTimeout(ctx, h.ls.ttl/3)
		resp, err := l.cli.Get(rctx, h.ekey)
		rcancel()
		if err == nil {
			if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != h.rev {
				w.gone(h)
				return
			}
			w.mu.Lock()
			if h.wid != 0 || h.state.Ended() || h.releasing.Load() || l.life.IsClosing() {
				w.mu.Unlock()
				return
			}
			w.next++
			h.wid = w.next
			h.wfrom = resp.Header.Revision + 1
			w.byID[h.wid] = h
			w.queueLocked(createReq(h))
			w.mu.Unlock()
			return
		}
		// Not answered: the lease deadline decides; try again.
		if !b.Wait(ctx) {
			return
		}
	}
}

// watchDelay is how long after acquiring the holder starts watching its
// key; it adds at most that much to the report of a key deleted from
// outside.
const watchDelay = 100 * time.Millisecond
