package redis

import (
	"context"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// The scripts run atomically on the server, so no other client can act
// between their check and their effect. Each touches only keys that share one
// hash tag (see keysFor in locker.go), so they run unchanged on Redis Cluster,
// where a script may only use keys of one slot. Keys are always passed in
// KEYS (also the wake-up channel, which is not a key) so that cluster clients
// route the script to the slot's master.

// acquireScript takes the lock and, only then, draws the next fencing token.
//
//	KEYS[1] lock key, KEYS[2] fence counter
//	ARGV[1] owner token, ARGV[2] lease in milliseconds,
//	ARGV[3] "1" to raise the token to at least the server clock in µs,
//	ARGV[4] with ARGV[3]: the fence counter's idle expiry in ms, "0" none
//	returns {1, fencing token} or {0, PTTL of the current holder}
//
// The counter is advanced before the SET so that a failing INCR (a foreign
// value under our prefix) leaves no lock behind: Redis does not roll a
// script back when one of its commands fails. The counter never expires:
// it must outlive every lock on the key for tokens to keep increasing.
//
// With the clock floor (WithClockTokens) the token is max(counter + 1,
// server time in microseconds): the same as INCR while the counter lives,
// and still larger than every earlier token when the counter is lost
// (restart without persistence, failover to a lagging replica), as long as
// the server clock has not gone back. Microseconds since 1970 stay below
// 2^53, so Lua's doubles hold them exactly. That is also what lets the
// counter expire after an idle period (WithFenceExpiry): once it is gone the
// clock floor alone keeps the next token above the last one.
//
// A lock that already carries our (fresh, random) owner token means this is
// a retry by the client of a request whose reply was lost: the lock is ours
// and the counter still holds our token, since only a successful acquire
// advances it.
var acquireScript = goredis.NewScript(`
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  return {1, tonumber(redis.call('GET', KEYS[2]))}
end
if holder then
  return {0, redis.call('PTTL', KEYS[1])}
end
local token
if ARGV[3] == '1' then
  if redis.replicate_commands then redis.replicate_commands() end
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
  if cur == nil then
    return redis.error_reply('fence counter ' .. KEYS[2] .. ' does not hold a number')
  end
  token = math.max(cur + 1, floor)
  if ARGV[4] ~= '0' then
    redis.call('SET', KEYS[2], string.format('%.0f', token), 'PX', ARGV[4])
  else
    redis.call('SET', KEYS[2], string.format('%.0f', token))
  end
else
  token = redis.call('INCR', KEYS[2])
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, token}
`)

// releaseScript deletes the lock only if it still carries our owner token,
// and then tells waiters, in the same atomic step, that the key is free.
//
//	KEYS[1] lock key, KEYS[2] wake-up channel, KEYS[3] last release
//	ARGV[1] owner token, ARGV[2] "1" to publish on a shard channel (Cluster),
//	ARGV[3] how long to remember the release, in milliseconds
//	returns 1 when released (now or by an earlier attempt of the same
//	release), 0 when the lock was no longer ours
//
// The release is remembered (the owner token under KEYS[3], for ARGV[3])
// because go-redis retries a request whose reply was lost (a connection
// reset, a read timeout): the retry finds the lock gone, and without the
// record it would report a release that succeeded as a lost lock. One record
// per key, overwritten by the next release: a retry comes within seconds.
// The record is written under pcall, after the DEL: on a server that is full
// (maxmemory under noeviction refuses every write that may grow memory) the
// release must still happen, as it frees memory; only the record is missing.
//
// SPUBLISH runs under pcall: on a server without it (Redis < 7) the release
// must still succeed, since the DEL cannot be rolled back; waiters then wake
// by their timers.
var releaseScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  if redis.call('GET', KEYS[3]) == ARGV[1] then
    return 1
  end
  return 0
end
redis.call('DEL', KEYS[1])
redis.pcall('SET', KEYS[3], ARGV[1], 'PX', ARGV[3])
if ARGV[2] == '1' then
  redis.pcall('SPUBLISH', KEYS[2], 'released')
else
  redis.call('PUBLISH', KEYS[2], 'released')
end
return 1
`)

// extendScript resets the lease of the lock only if it still carries our
// owner token.
//
//	KEYS[1] lock key
//	ARGV[1] owner token, ARGV[2] lease in milliseconds
//	returns 1 when extended, 0 when the lock was no longer ours
var extendScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
`)

// releaseMemory is how long the release script remembers a release, so that
// a retry of it by the client is recognised (see releaseScript). go-redis
// retries at most MaxRetries times (3 by default), each after a failed
// attempt bounded by the ReadTimeout (3s) and a backoff of at most 512ms.
const releaseMemory = 15 * time.Second

// millis renders a lease for PX/PEXPIRE, rounded up: the server may keep the
// lock a little longer than the holder believes, never shorter.
func millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// acquireResult is what one attempt found.
type acquireResult struct {
	ok    bool
	token int64         // when ok
	pttl  time.Duration // when !ok: the holder's remaining lease; <0 unknown
}

func (l *Locker) runAcquire(ctx context.Context, k keys, owner string, ttl time.Duration) (acquireResult, error) {
	clock := "0"
	if l.cfg.clockTokens {
		clock = "1"
	}
	v, err := acquireScript.Run(ctx, l.client, []string{k.lock, k.fence}, owner, millis(ttl), clock, millis(l.cfg.fenceExpiry)).Int64Slice()
	if err != nil {
		return acquireResult{}, err
	}
	if len(v) != 2 {
		return acquireResult{}, fmt.Errorf("redis: acquire script returned %d values, want 2", len(v))
	}
	if v[0] == 1 {
		if v[1] <= 0 {
			return acquireResult{}, fmt.Errorf("redis: fence counter %s returned token %d; it must be positive (was the counter overwritten?)", k.fence, v[1])
		}
		return acquireResult{ok: true, token: v[1]}, nil
	}
	pttl := time.Duration(-1)
	if v[1] >= 0 {
		pttl = time.Duration(v[1]) * time.Millisecond
	}
	return acquireResult{pttl: pttl}, nil
}

func (l *Locker) runRelease(ctx context.Context, k keys, owner string) (bool, error) {
	n, err := releaseScript.Run(ctx, l.client, k.releaseKeys(), l.releaseArgs(owner)...).Int64()
	return n == 1, err
}

func (k keys) releaseKeys() []string { return []string{k.lock, k.wake, k.released} }

func (l *Locker) releaseArgs(owner string) []any {
	return []any{owner, l.shardedFlag(), millis(releaseMemory)}
}

func (l *Locker) runExtend(ctx context.Context, k keys, owner string, ttl time.Duration) (bool, error) {
	n, err := extendScript.Run(ctx, l.client, []string{k.lock}, owner, millis(ttl)).Int64()
	return n == 1, err
}

func (l *Locker) shardedFlag() string {
	if l.sharded {
		return "1"
	}
	return "0"
}
