package memlock

import (
	"context"
	"fmt"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

var _ locker.Inspector = (*Locker)(nil)

// Inspect reports whether key is held in the Locker's Store, with the
// holder's token and remaining lease. It takes nothing and changes nothing.
func (l *Locker) Inspect(ctx context.Context, key string) (locker.LockInfo, error) {
	if err := locker.ValidateKey(key); err != nil {
		return locker.LockInfo{}, locker.KeyError("inspect", key, err)
	}
	if ctx.Err() != nil {
		return locker.LockInfo{}, locker.KeyError("inspect", key, backend.ContextError(ctx))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.usableLocked(); err != nil {
		return locker.LockInfo{}, locker.KeyError("inspect", key, err)
	}
	return l.store.inspect(key), nil
}

func (s *Store) inspect(key string) locker.LockInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	info := locker.LockInfo{Key: key}
	if e := s.keys[key]; e != nil && e.holder != nil {
		info.Held = true
		info.Token = e.holder.token
		info.TTL = max(time.Until(e.holder.deadline), 0)
	}
	return info
}

// Revoke takes key's lock away from its holder, as an operator deleting a
// lock on a server would, and reports whether the key was held. The holder's
// Handle reports the loss (Done closes, Err wraps locker.ErrLost) and the key
// goes to the next waiter, with a higher token. It is for testing how a
// program handles the loss of a lock: its Release then returns an error
// wrapping locker.ErrLost and touches nothing of the next holder's.
//
// Unlike a server, the Store can tell the holder at once; a network backend's
// holder finds out at its next renewal at the latest.
func (s *Store) Revoke(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[key]
	if e == nil || e.holder == nil {
		return false
	}
	g := e.holder
	g.timer.Stop()
	g.state.End(locker.KeyError("hold", key, fmt.Errorf("%w: revoked in the store (Store.Revoke)", locker.ErrLost)))
	s.handOffLocked(e)
	return true
}
