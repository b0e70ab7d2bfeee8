package memlock

import (
	"context"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

var _ locker.Inspector = (*Locker)(nil)

// Inspect reports whether key is held in the Locker's Store, with the
// holder's token and remaining lease. It takes nothing and changes nothing.
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
	return l.store.inspect(key), nil
}
