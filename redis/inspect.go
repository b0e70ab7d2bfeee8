package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

var _ locker.Inspector = (*Locker)(nil)

// inspectScript reads a lock in one atomic step: whether it is held, its
// remaining lease, and the fence counter, which while the lock is held is
// its holder's token (nobody else can have drawn one since).
//
//	KEYS[1] lock key, KEYS[2] fence counter
//	returns {held 0/1, pttl ms, fence or false, the lock's value or false}
var inspectScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
local held = 0
if v then held = 1 end
return {held, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]), v}
`)

// withDescription is the value of a lock whose holder described itself
// with locker.WithOwner: its random owner token (base64url, so without a
// space), a space and the description; or the owner token alone. The whole
// value is the owner token that Release and renewal compare, so the
// description costs no command of its own, and the owner token stays
// unique since its random part is.
func withDescription(owner, desc string) string {
	if desc == "" {
		return owner
	}
	return owner + " " + desc
}

// description is the holder's description in a lock's value (see
// withDescription), or "".
func description(value string) string {
	_, desc, _ := strings.Cut(value, " ")
	return desc
}

// Inspect reports whether key is held, the holder's fencing token, the
// lease the server has left for it and the holder's locker.WithOwner
// description (kept in the lock's value, after its owner token). It reads
// two keys in one script and changes nothing.
func (l *Locker) Inspect(ctx context.Context, key string) (locker.LockInfo, error) {
	ctx, done, err := l.life.Enter(ctx, "inspect", key)
	if err != nil {
		return locker.LockInfo{}, err
	}
	defer done()
	k := l.keysFor(key)
	var res []any
	err = l.exec(ctx, func(ctx context.Context) error {
		v, err := inspectScript.Run(ctx, l.via(ctx), []string{k.lock, k.fence}).Slice()
		res = v
		return err
	}, nil)
	if err != nil {
		return locker.LockInfo{}, backend.KeyError("inspect", key, err)
	}
	info := locker.LockInfo{Key: key}
	if len(res) != 4 {
		return info, backend.KeyError("inspect", key, fmt.Errorf("redis: unexpected reply %v", res))
	}
	if held, _ := res[0].(int64); held != 1 {
		return info, nil
	}
	info.Held = true
	if v, ok := res[3].(string); ok {
		info.Owner = description(v)
	}
	if pttl, _ := res[1].(int64); pttl > 0 {
		info.TTL = time.Duration(pttl) * time.Millisecond
	}
	if s, ok := res[2].(string); ok {
		t, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return info, backend.KeyError("inspect", key, fmt.Errorf("redis: fence counter %s holds %q, not a number", k.fence, s))
		}
		if info.Token, err = l.cfg.Token(t); err != nil {
			return info, backend.KeyError("inspect", key, err)
		}
	}
	return info, nil
}
