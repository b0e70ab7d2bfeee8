package memlock

import (
	"context"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

var _ locker.Inspector = (*Locker)(nil)

// Inspect reports whether key is held in the Locker's Store, with the
// holder's token (plus this Locker's token base) and remaining lease. It
// takes nothing and changes nothing.
func (l *Locker) Inspect(ctx context.Context, key string) (locker.LockInfo, error) {
	_, done, err := l.life.Enter(ctx, "inspect", key)
	if err != nil {
		return locker.LockInfo{}, err
	}
	defer done()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.isCut {
		return locker.LockInfo{}, backend.KeyError("inspect", key, errUnreachable)
	}
	info := l.store.inspect(key)
	if info.Held {
		if info.Token, err = l.cfg.Token(info.Token); err != nil {
			return locker.LockInfo{}, backend.KeyError("inspect", key, err)
		}
	}
	return info, nil
}
