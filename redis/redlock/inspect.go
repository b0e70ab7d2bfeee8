package redlock

import (
	"context"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

var _ locker.Inspector = (*Locker)(nil)

// Inspect reports who holds key: held when one owner has the lock on a
// majority of the nodes, with the fencing token recorded there by its
// grant or write-back and the time until it stops holding a majority (if nobody
// renews it). It reads every node in parallel, takes nothing and changes
// nothing. When too few nodes answer to tell, the error wraps ErrNoQuorum.
//
// The token is the value a majority of the nodes record for the holder:
// a holder's token is recorded on a majority (those whose grant returned
// it, and those the write-back raised to it), and a node that granted but
// returned another value keeps that one. When the holder's nodes that
// answered do not have one value on a majority (a node that records the
// token did not answer, or lost the lock early), the holder's token cannot
// be told, and the error wraps ErrNoQuorum.
func (l *Locker) Inspect(ctx context.Context, key string) (locker.LockInfo, error) {
	info := locker.LockInfo{Key: key}
	ctx, done, err := l.life.Enter(ctx, "inspect", key)
	if err != nil {
		return info, err
	}
	defer done()
	k := l.keysFor(key)
	tm, _ := l.cfg.timing(l.cfg.TTL)
	res, err := fanout(l, ctx, ctx, l.closing, l.all, tm.nodeTimeout,
		func(ctx context.Context, _ int, c goredis.UniversalClient) (lockState, error) {
			return runInspect(ctx, c, k)
		}, nil, nil)
	if err != nil {
		return info, backend.KeyError("inspect", key, err)
	}
	byOwner := map[string][]lockState{}
	answered := 0
	var firstErr error
	for i := range l.clients {
		if !res.ok(i) {
			if firstErr == nil {
				firstErr = fmt.Errorf("%s: %w", l.addrs[i], res.err[i])
			}
			continue
		}
		answered++
		if st := res.v[i]; st.owner != "" {
			byOwner[st.owner] = append(byOwner[st.owner], st)
		}
	}
	most := 0
	for _, sts := range byOwner {
		most = max(most, len(sts))
		if len(sts) < l.quorum {
			continue
		}
		info.Held = true
		var pttls []time.Duration
		tokens := make([]int64, len(sts))
		for j, st := range sts {
			tokens[j] = st.token
			pttls = append(pttls, st.pttl)
		}
		if t, n := agreed(tokens, l.quorum); n >= l.quorum {
			info.Token = t
		} else {
			return locker.LockInfo{Key: key}, backend.KeyError("inspect", key, fmt.Errorf(
				"%w: the holder has the lock on %d of %d nodes (%d answered), but no token is recorded on a majority: %v",
				ErrNoQuorum, len(sts), len(l.clients), answered, tokens))
		}
		info.TTL = holderLeft(pttls, l.quorum)
		info.Owner = description(sts[0].owner)
		if info.Token > 0 {
			if info.Token, err = l.cfg.Token(info.Token); err != nil {
				return locker.LockInfo{Key: key}, backend.KeyError("inspect", key, err)
			}
		}
		return info, nil
	}
	if most+len(l.clients)-answered >= l.quorum {
		// The nodes that did not answer could make a majority holder.
		return info, backend.KeyError("inspect", key, fmt.Errorf("%w: %d of %d nodes answered, too few to tell: %w", ErrNoQuorum, answered, len(l.clients), firstErr))
	}
	return info, nil
}
