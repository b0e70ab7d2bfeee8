package zookeeper

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

var _ locker.Inspector = (*Locker)(nil)

// Inspect reports whether key is held, as the server sees it: held when
// its lock directory has a lock node, the lowest being the holder's, whose
// czxid (plus the Locker's token base) is the token. TTL is always 0: a ZooKeeper lock has no lease of
// its own, it lasts as long as its holder's session (see the package
// documentation). A holder that crashed shows as holding until the server
// expires its session. Owner is the holder's locker.WithOwner description,
// the lowest node's data, written by the create itself (empty where an ACL
// lets Inspect list the directory but not read the node). Inspect creates,
// watches and changes nothing; it syncs the member it talks to with the
// leader, lists the directory and reads the lowest node.
func (l *Locker) Inspect(ctx context.Context, key string) (locker.LockInfo, error) {
	const op = "inspect"
	cctx, done, err := l.life.Enter(ctx, op, key)
	if err != nil {
		return locker.LockInfo{}, err
	}
	defer done()
	fail := func(err error) (locker.LockInfo, error) {
		return locker.LockInfo{}, backend.KeyError(op, key, l.life.Why(cctx, err))
	}
	if err := l.awaitChecked(cctx); err != nil {
		return fail(err)
	}
	conn := l.primary.conn

	dir := LockDir(l.cfg.Prefix, key)
	// A member serves reads from its own copy, which may lag the leader's:
	// an ensemble member that had not yet applied another client's
	// acquisition reported the key free (seen once in the ensemble's
	// conformance run, Fencing/TokenBase). sync makes the member catch up
	// with the leader first, so that Inspect sees every acquisition that
	// completed before it was called. (sync does not look at the path.)
	if err := l.call(cctx, func() error { _, err := conn.Sync(dir); return err }, nil); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return fail(err)
	}
	for tries := 0; ; tries++ {
		var kids []string
		err := l.call(cctx, func() error {
			k, _, err := conn.Children(dir)
			kids = k
			return err
		}, nil)
		if errors.Is(err, zk.ErrNoNode) {
			return locker.LockInfo{Key: key}, nil
		}
		if err != nil {
			return fail(err)
		}
		nodes := sortNodes(kids)
		if len(nodes) == 0 {
			return locker.LockInfo{Key: key}, nil
		}
		var (
			data []byte
			st   *zk.Stat
		)
		err = l.call(cctx, func() error {
			var err error
			data, st, err = conn.Get(dir + "/" + nodes[0].name)
			if errors.Is(err, zk.ErrNoAuth) {
				// An ACL that lets us list but not read: the holder is
				// known, its description not.
				var exists bool
				exists, st, err = conn.Exists(dir + "/" + nodes[0].name)
				if err == nil && !exists {
					err = zk.ErrNoNode
				}
			}
			return err
		}, nil)
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			return fail(err)
		}
		if err == nil {
			token, err := l.cfg.Token(st.Czxid)
			if err != nil {
				return fail(err)
			}
			return locker.LockInfo{Key: key, Held: true, Token: token, Owner: string(data)}, nil
		}
		// The lowest node went between the two requests: look again.
		if tries >= 10 {
			return fail(fmt.Errorf("zookeeper: the lock directory %s changed under every look", dir))
		}
	}
}
