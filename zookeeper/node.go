package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"path"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/backoff"
)

// createdNode is what the create of a contender's node told.
type createdNode struct {
	node string
	// dir is the lock directory's stat just after the create, in the same
	// transaction (nil when the node was adopted or created without the
	// multi): its NumChildren says whether the node is alone, its Mzxid is
	// the node's czxid.
	dir *zk.Stat
	sid int64 // the session that answered, with dir
	// retried: an earlier create of the same GUID lost its answer, so a
	// second node of ours may yet appear (see Handle.dup).
	retried bool
}

// createNode creates the contender's protected ephemeral-sequential node in
// dir, named for what a asks, making the directory when it is missing, and adopts the node when
// the answer to the create was lost with the connection.
//
// The create goes out in a multi with an empty write to the directory's
// data (unconditional, version -1): the answer to that write is the
// directory's stat just after the create, in the same transaction, which
// says whether anyone else is in the queue. An uncontended acquisition so
// costs one request, as a bare create does. A server that refuses the write
// (an ACL on the directory without WRITE) makes the Locker use plain
// creates from then on.
func (s *session) createNode(ctx context.Context, dir, guid string, a ask) (createdNode, error) {
	prefix := dir + "/" + a.nodeName(guid)
	retried := false
	for tries := 0; ; tries++ {
		var c createdNode
		multi := !s.l.noMulti.Load() && !s.l.hot.recent(dir)
		sid := s.conn.SessionID()
		err := s.l.call(ctx, func() error {
			if !multi {
				p, err := s.conn.Create(prefix, a.data(), zk.FlagEphemeral|zk.FlagSequence, s.l.cfg.acl)
				c.node = p
				return err
			}
			r, err := s.conn.Multi(
				&zk.CreateRequest{Path: prefix, Data: a.data(), Flags: zk.FlagEphemeral | zk.FlagSequence, Acl: s.l.cfg.acl},
				&zk.SetDataRequest{Path: dir, Version: -1})
			if err == nil && len(r) == 2 && r[1].Stat != nil {
				c = createdNode{node: r[0].String, dir: r[1].Stat, sid: sid}
				if now := s.conn.SessionID(); now != sid {
					// The session changed around the request: which one
					// owns the node is not known here; contend reads it.
					c.dir, c.sid = nil, 0
				}
				return nil
			}
			if err != nil && len(r) == 2 && r[0].Error == nil && r[1].Error != nil && !isConnErr(err) {
				// The create would have gone through; the write to the
				// directory did not.
				return errMultiRefused{err}
			}
			if err == nil {
				return fmt.Errorf("zookeeper: unexpected answer to a multi: %+v", r)
			}
			return err
		}, func(err error) {
			// Abandoned, and created all the same: a node nobody
			// contends with would block everyone after it.
			switch {
			case err == nil:
				s.deleteDetached(c.node)
			case isConnErr(err):
				s.dropCreate(dir, guid, sid)
			}
		})
		var refused errMultiRefused
		switch {
		case err == nil:
			c.retried = retried
			return c, nil
		case errors.As(err, &refused) || errors.Is(err, zk.ErrUnknown) || errors.Is(err, zk.ErrAPIError) || isUnimplemented(err):
			// Nothing was applied: go on with plain creates.
			s.l.logf("zookeeper: creating lock nodes without the directory write from now on: %v", err)
			s.l.noMulti.Store(true)
		case errors.Is(err, zk.ErrNoNode) && tries < 8:
			if err := s.ensureDir(ctx, dir); err != nil {
				return createdNode{}, err
			}
		case isConnErr(err) && tries < 8 && ctx.Err() == nil && !s.l.life.IsClosing():
			// The create may have been applied: look for our GUID, until
			// a listing answers (creating again before that could leave
			// the first node behind as a ghost of our own).
			retried = true
			found, err := s.findOwnRetrying(ctx, dir, guid)
			if err != nil {
				s.dropCreate(dir, guid, sid)
				return createdNode{}, err
			}
			if found != "" {
				return createdNode{node: found, retried: true}, nil
			}
		default:
			if isConnErr(err) {
				// Given up with the create's outcome unknown: should it
				// have been applied, the node must not stay behind.
				s.dropCreate(dir, guid, sid)
			}
			if errors.Is(err, zk.ErrNoAuth) {
				return createdNode{}, fmt.Errorf("zookeeper: creating a lock node in %s: %w (its ACL grants none of this session's identities, given with WithAuth or user:password@, the CREATE right)", dir, err)
			}
			return createdNode{}, err
		}
	}
}

// errMultiRefused says the server refused the directory write of the
// create's multi (and so applied nothing).
type errMultiRefused struct{ err error }

func (e errMultiRefused) Error() string { return e.err.Error() }

func (e errMultiRefused) Unwrap() error { return e.err }

// findOwnRetrying is findOwn repeated, once the session is back, until the
// listing is answered.
func (s *session) findOwnRetrying(ctx context.Context, dir, guid string) (string, error) {
	for {
		if _, _, err := s.awaitSession(ctx); err != nil {
			return "", err
		}
		found, err := s.findOwn(ctx, dir, guid)
		if !isConnErr(err) || errors.Is(err, zk.ErrClosing) {
			return found, err
		}
		// The connection is down and the Locker may not know yet.
		if !backoff.Sleep(ctx, 50*time.Millisecond) {
			return "", backend.ContextError(ctx)
		}
	}
}

// findOwn returns the path of the node in dir that carries guid, or "".
func (s *session) findOwn(ctx context.Context, dir, guid string) (string, error) {
	var kids []string
	err := s.l.call(ctx, func() error {
		k, _, err := s.conn.Children(dir)
		kids = k
		return err
	}, nil)
	if errors.Is(err, zk.ErrNoNode) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	// Should a create have been applied twice, the lowest node keeps our
	// place in the queue (contend deletes the others).
	found, seq := "", int64(0)
	for _, k := range kids {
		if n, ok := parseNode(k); ok && n.guid == guid && (found == "" || n.seq < seq) {
			found, seq = dir+"/"+k, n.seq
		}
	}
	return found, nil
}

// ensureDir creates dir and its missing parents as container nodes (or
// persistent ones, on servers without containers), the deepest first: it
// goes up a level only when the server answers that the parent is missing.
// So the Locker needs no right on the nodes above its root that exist
// (ZooKeeper checks CREATE on the parent before it looks whether the node
// is there): an operator may make the root and lock everything above it
// down.
func (s *session) ensureDir(ctx context.Context, dir string) error {
	var missing []string // below p, deepest last
	p := dir
	for {
		err := s.l.call(ctx, func() error { return s.createDir(p) }, nil)
		if err == nil || errors.Is(err, zk.ErrNodeExists) {
			break
		}
		if parent := path.Dir(p); errors.Is(err, zk.ErrNoNode) && parent != "/" && len(missing) < 64 {
			missing = append(missing, p)
			p = parent
			continue
		}
		return dirError(p, err)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		p := missing[i]
		err := s.l.call(ctx, func() error { return s.createDir(p) }, nil)
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return dirError(p, err)
		}
	}
	return nil
}

// dirError is the error of a directory create; a refusal by the parent's
// ACL names what is missing.
func dirError(p string, err error) error {
	if errors.Is(err, zk.ErrNoAuth) {
		return fmt.Errorf("zookeeper: creating %s: %w (the ACL of %s grants none of this session's identities, given with WithAuth or user:password@, the CREATE right)", p, err, path.Dir(p))
	}
	return fmt.Errorf("zookeeper: creating %s: %w", p, err)
}

func (s *session) createDir(p string) error {
	if s.l.containers.Load() {
		_, err := s.conn.CreateContainer(p, nil, zk.FlagContainer, s.l.cfg.acl)
		if !errors.Is(err, zk.ErrUnknown) && !errors.Is(err, zk.ErrAPIError) && !isUnimplemented(err) {
			return err
		}
		// A server before 3.5.3 does not know container nodes.
		s.l.containers.Store(false)
	}
	_, err := s.conn.Create(p, nil, zk.FlagPersistent, s.l.cfg.acl)
	return err
}

// hotKeys remembers, roughly, which lock directories were found contended
// in the last hotWindow. The create of a contender's node goes out in a
// multi with a write to the directory (see createNode), which saves the
// listing when the key is free: one request for an uncontended
// acquisition. On a contended key the listing is needed anyway, and the
// bigger transaction only slows the queue: measured interleaved against
// go-zookeeper's Lock, handoffs at 8 waiters took 4-17% longer with the
// multi and the same without it. So a directory found contended gets plain
// creates for a while. The table is a fixed array of slots by hash: two
// directories that share a slot only cost each other a listing.
type hotKeys struct{ slots [256]atomic.Int64 }

// hotWindow is how long a directory found contended gets plain creates.
const hotWindow = 10 * time.Second

func hotSlot(dir string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(dir))
	return int(h.Sum32() % 256)
}

func (k *hotKeys) mark(dir string) { k.slots[hotSlot(dir)].Store(time.Now().UnixNano()) }

func (k *hotKeys) recent(dir string) bool {
	t := k.slots[hotSlot(dir)].Load()
	return t != 0 && time.Since(time.Unix(0, t)) < hotWindow
}
