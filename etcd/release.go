package etcd

import (
	"context"
	"errors"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Release whose deletion got no answer tries again, and may then find the
// key gone: its own unanswered attempt deleted it, or the key was taken away
// meanwhile (deleted from outside, its lease revoked or expired on the
// server) and another contender may hold the lock since. A deletion leaves
// no trace of who made it, so the transaction that deletes the key also
// writes the lease's release record: one key per lease, on the lease (so it
// ends with it), outside every lock directory, whose value is the create
// revision of the key the transaction deleted. A later attempt that finds
// the key gone reads the record (in the same transaction's Else branch): if
// it names our key, our transaction deleted it. If another release on the
// lease has written the record since, the history decides: the revision at
// which our key was deleted (the first delete event after its creation) is
// ours only if the record was written at that same revision, with our
// value. Compacted history, or no answer, leaves it unknown, which Release
// reports as a loss: it returns nil only when it is proved.

// releaseRecord returns the key of the release record of the lease id under
// prefix: <prefix>/%released/<lease id in hex>. No lock directory is
// <prefix>/%released/: EncodeKey escapes '%' as "%25", so no encoded key
// begins with "%r".
func releaseRecord(prefix string, id clientv3.LeaseID) string {
	b := append([]byte(prefix), "/%released/"...)
	return string(appendHex16(b, uint64(id)))
}

// releaseMark is the value of the release record written by the deletion of
// the key created at rev: revisions are unique cluster-wide, and each
// creating transaction of ours puts one key.
func releaseMark(rev int64) string { return strconv.FormatInt(rev, 10) }

// ownDeletion reports whether one of Release's own attempts deleted h's key,
// when a later attempt, whose answer is resp, found it gone (see above). An
// error means it could not be told.
func (l *Locker) ownDeletion(ctx context.Context, h *Handle, mark string, resp *clientv3.TxnResponse) (bool, error) {
	if rr := resp.Responses[0].GetResponseRange(); rr != nil && len(rr.Kvs) == 1 && string(rr.Kvs[0].Value) == mark {
		return true, nil // the lease's latest release was ours
	}
	b := quickBackoff()
	for attempt := 1; ; attempt++ {
		ours, err := l.deletedByUs(ctx, h, mark)
		if err == nil || ctx.Err() != nil || !retryable(err) || attempt == 3 || !b.Wait(ctx) {
			return ours, err
		}
	}
}

// errWatchEnded says a watch of the history ended without an answer.
var errWatchEnded = errors.New("etcd: the watch of the key's history ended")

// deletedByUs reads the history: the revision at which h's key was deleted,
// and the lease's release record as of that revision.
func (l *Locker) deletedByUs(ctx context.Context, h *Handle, mark string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, attemptWait(h.ls.ttl))
	defer cancel()
	var del int64
	wch := l.cli.Watch(ctx, h.ekey, clientv3.WithRev(h.rev+1), clientv3.WithFilterPut())
recv:
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return false, err // compacted, among others
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				del = ev.Kv.ModRevision
				break recv
			}
		}
	}
	if del == 0 {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		return false, errWatchEnded
	}
	gr, err := l.cli.Get(ctx, h.ls.marker, clientv3.WithRev(del))
	if err != nil {
		return false, err
	}
	return len(gr.Kvs) == 1 && gr.Kvs[0].ModRevision == del && string(gr.Kvs[0].Value) == mark, nil
}
