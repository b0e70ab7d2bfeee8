package etcd

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

var _ locker.Inspector = (*Locker)(nil)

// Inspect reports whether key is held, as the cluster sees it: the holder
// is the key of smallest create revision in the lock directory (whether or
// not its contender has seen the watch event yet); Token is that create
// revision, the holder's fencing token; TTL is what remains of the
// holder's lease as the server counts it (whole seconds), Lease the TTL the
// server granted that lease (the holder's Handle.TTL), and Owner the
// holder's locker.WithOwner description, the value of its key. It reads twice
// (the directory, then the lease) and writes nothing.
func (l *Locker) Inspect(ctx context.Context, key string) (locker.LockInfo, error) {
	const op = "inspect"
	ctx, done, err := l.life.Enter(ctx, op, key)
	if err != nil {
		return locker.LockInfo{}, err
	}
	defer done()
	info, err := l.inspect(ctx, key)
	if err != nil {
		return locker.LockInfo{}, backend.KeyError(op, key, l.life.Why(ctx, err))
	}
	return info, nil
}

func (l *Locker) inspect(ctx context.Context, key string) (locker.LockInfo, error) {
	dir := LockDir(l.cfg.Prefix, key)
	for attempt := 0; ; attempt++ {
		resp, err := l.cli.Get(ctx, dir, clientv3.WithFirstCreate()...)
		if err != nil {
			return locker.LockInfo{}, fmt.Errorf("etcd: %w", err)
		}
		info := locker.LockInfo{Key: key}
		if len(resp.Kvs) == 0 {
			return info, nil
		}
		kv := resp.Kvs[0]
		token, err := l.cfg.Token(kv.CreateRevision)
		if err != nil {
			return locker.LockInfo{}, err
		}
		info.Held, info.Token, info.Owner = true, token, string(kv.Value)
		if kv.Lease == 0 {
			return info, nil // not a key of ours: no lease to report
		}
		ttl, err := l.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		if err != nil {
			return locker.LockInfo{}, fmt.Errorf("etcd: %w", err)
		}
		if ttl.TTL < 0 && attempt < 3 {
			// The lease ended between the two reads, and the holder's key
			// with it: look again.
			continue
		}
		info.TTL = time.Duration(max(ttl.TTL, 0)) * time.Second
		if ttl.TTL >= 0 {
			info.Lease = time.Duration(ttl.GrantedTTL) * time.Second
		}
		return info, nil
	}
}
