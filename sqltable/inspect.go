package sqltable

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

var _ locker.Inspector = (*Locker)(nil)

// Inspect reports key's lock as the lock table has it, by the database's
// clock: held, with the holder's token (plus the Locker's token base) and
// remaining lease, while the row's
// lease has not run out; not held (token 0, TTL 0) when the key has no row,
// was released, or its lease ran out (a crashed holder's key shows as free
// from that moment, as it is to Acquire). Owner is the holder's
// locker.WithOwner description, kept in the row's owner column (see
// "Holders' descriptions" in the package documentation). It reads one row
// and changes nothing.
func (l *Locker) Inspect(ctx context.Context, key string) (locker.LockInfo, error) {
	info := locker.LockInfo{Key: key}
	cctx, done, err := l.life.Enter(ctx, "inspect", key)
	if err != nil {
		return info, err
	}
	defer done()
	if err := l.init(cctx); err != nil {
		return info, backend.KeyError("inspect", key, l.life.Why(cctx, err))
	}
	var token, us int64
	var owner string
	err = l.retryIdem(cctx, func(ctx context.Context) error {
		return l.db.QueryRowContext(ctx, l.st.inspect, key).Scan(&token, &us, &owner)
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return info, nil
	case err != nil:
		return info, backend.KeyError("inspect", key, l.life.Why(cctx, err))
	}
	if us > 0 {
		if token, err = l.cfg.Token(token); err != nil {
			return info, backend.KeyError("inspect", key, err)
		}
		info.Held, info.Token, info.TTL = true, token, time.Duration(us)*time.Microsecond
		info.Owner = ownerDescription(owner)
	}
	return info, nil
}
