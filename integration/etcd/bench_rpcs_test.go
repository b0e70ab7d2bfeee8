package etcd_test

import (
	"context"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// rpcCounter counts the requests a client sends through its KV and Lease
// interfaces (every round trip the lock code makes: Txn, Get, Put, Delete,
// Grant, Revoke, KeepAliveOnce; watches are counted apart, as streams
// opened).
type rpcCounter struct{ n atomic.Int64 }

// count swaps cli's KV and Lease for counting wrappers.
func (c *rpcCounter) count(cli *clientv3.Client) {
	cli.KV = countingKV{cli.KV, c}
	cli.Lease = countingLease{cli.Lease, c}
	cli.Watcher = countingWatcher{cli.Watcher, c}
}

type countingKV struct {
	clientv3.KV
	c *rpcCounter
}

func (k countingKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	k.c.n.Add(1)
	return k.KV.Put(ctx, key, val, opts...)
}

func (k countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	k.c.n.Add(1)
	return k.KV.Get(ctx, key, opts...)
}

func (k countingKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	k.c.n.Add(1)
	return k.KV.Delete(ctx, key, opts...)
}

func (k countingKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	k.c.n.Add(1)
	return k.KV.Do(ctx, op)
}

func (k countingKV) Txn(ctx context.Context) clientv3.Txn { return countingTxn{k.KV.Txn(ctx), k.c} }

type countingTxn struct {
	clientv3.Txn
	c *rpcCounter
}

func (t countingTxn) If(cs ...clientv3.Cmp) clientv3.Txn { return countingTxn{t.Txn.If(cs...), t.c} }
func (t countingTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	return countingTxn{t.Txn.Then(ops...), t.c}
}
func (t countingTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	return countingTxn{t.Txn.Else(ops...), t.c}
}
func (t countingTxn) Commit() (*clientv3.TxnResponse, error) {
	t.c.n.Add(1)
	return t.Txn.Commit()
}

type countingLease struct {
	clientv3.Lease
	c *rpcCounter
}

func (l countingLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	l.c.n.Add(1)
	return l.Lease.Grant(ctx, ttl)
}

func (l countingLease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	l.c.n.Add(1)
	return l.Lease.Revoke(ctx, id)
}

func (l countingLease) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	l.c.n.Add(1)
	return l.Lease.KeepAliveOnce(ctx, id)
}

type countingWatcher struct {
	clientv3.Watcher
	c *rpcCounter
}

func (w countingWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	w.c.n.Add(1)
	return w.Watcher.Watch(ctx, key, opts...)
}
