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
// watches and changes nothing; it lists the directory and reads the
// lowest node.
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
