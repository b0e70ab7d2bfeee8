package redis

import (
	"context"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/redis/internal/releases"
)

// The scripts of the lock families (semaphores and reader-writer locks):
// one script per step, as the mutex's, over one layout for both families.
//
// A family's key k is stored under names that share the mutex's hash tag
// (one Cluster slot) but not its names: "<prefix>{base64url(k)}:sem:" or
// ":rw:" followed by
//
//	holders          hash: owner token → fencing token, one field per holder
//	leases           sorted set: the same owners, scored by the deadline of
//	                 their lease (ms, server clock)
//	fence            the key's fencing counter (as the mutex's, own to the family)
//	limit            a semaphore's n, while the key has holders or waiters
//	queue, waiters   the waiters, by arrival and by deadline (as the mutex's)
//	released-by:<o>  a release by owner token o (package releases)
//	wake:<id>        Pub/Sub channel of the Locker with that id
//
// An owner token starts with its holder's kind: 'p' a permit of a
// semaphore, 'r' a reader, 'w' a writer; a queue entry "<Locker id>:<owner>"
// carries it too. A writer is only admitted when nobody holds the key, so
// when a writer holds it, it is the only holder.
//
// Admission is first come, first served. A waiter is admitted once the
// holders as they stand and the waiters ahead of it in the queue leave room
// for it: for a semaphore of n, holders + waiters ahead < n; a reader, when
// no writer holds the key and no writer waits ahead of it; a writer, when
// nobody holds the key and nobody waits ahead of it. A newcomer (a
// TryAcquire, or an Acquire's first attempt) counts the whole queue as
// ahead of it, so it never overtakes a waiter.
//
// Every script that changes what the key admits (a release, a leave, the
// pruning of leases and queue entries past their deadline, an admission)
// tells the waiters that became admissible in that step, and only them: it
// computes the admissible waiters before and after, and publishes to the
// new ones. A freed permit wakes one waiter; a writer's release wakes the
// readers queued behind it, which are all admitted together.

// luaFamily is shared by the family scripts, after luaQueue (and luaFence,
// releases.Lua where needed). The scripts all take the same first KEYS:
//
//	KEYS[1] holders, KEYS[2] leases, KEYS[3] queue, KEYS[4] waiters, KEYS[5] limit
//
// and call redis.replicate_commands before their first write (they call
// TIME).
const luaFamily = `
local function kind_of(owner)
  return string.sub(owner, 1, 1)
end
local function entry_kind(entry)
  return string.match(entry, ':(.)')
end
-- keep makes key live at least ms from now (it never shortens a life).
local function keep(key, ms)
  if redis.call('PTTL', key) < tonumber(ms) then
    redis.call('PEXPIRE', key, ms)
  end
end
-- holding: how many hold the key (leases as they stand, past ones
-- included until pruned), and whether a writer does.
local function holding()
  local n = redis.call('ZCARD', KEYS[2])
  if n == 1 then
    return n, kind_of(redis.call('ZRANGE', KEYS[2], 0, 0)[1]) == 'w'
  end
  return n, false
end
-- limit_of: the key's semaphore limit as stored, or 0 for a reader-writer
-- lock (sem ~= '1') or when none is stored.
local function limit_of(sem)
  if sem ~= '1' then
    return 0
  end
  return tonumber(redis.call('GET', KEYS[5]) or '0') or 0
end
-- writer_in: whether one of the first count queue entries is a writer.
local function writer_in(count)
  local i = 0
  while i < count do
    local batch = redis.call('ZRANGE', KEYS[3], i, math.min(i + 63, count - 1))
    if #batch == 0 then
      return false
    end
    for _, e in ipairs(batch) do
      if entry_kind(e) == 'w' then
        return true
      end
    end
    i = i + 64
  end
  return false
end
-- admissible: the queue entries that the holders as they stand admit, in
-- order. A semaphore with no stored limit admits nobody from the queue.
local function admissible(sem, lim)
  local nh, writer = holding()
  if sem == '1' then
    if lim - nh <= 0 then
      return {}
    end
    return redis.call('ZRANGE', KEYS[3], 0, lim - nh - 1)
  end
  local out = {}
  if writer then
    return out
  end
  local i = 0
  while true do
    local batch = redis.call('ZRANGE', KEYS[3], i, i + 63)
    if #batch == 0 then
      return out
    end
    for _, e in ipairs(batch) do
      if entry_kind(e) == 'w' then
        if #out == 0 and nh == 0 then
          out[1] = e
        end
        return out
      end
      out[#out + 1] = e
    end
    i = i + 64
  end
end
-- notify_new tells the entries of after that are not in before (nor me).
local function notify_new(before, after, me, base, sharded)
  local seen = {}
  for _, e in ipairs(before) do
    seen[e] = true
  end
  for _, e in ipairs(after) do
    if not seen[e] and e ~= me then
      notify(base, e, sharded)
    end
  end
end
-- prune_holders drops the holders whose lease has run out.
local function prune_holders(now)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
  for _, o in ipairs(dead) do
    redis.call('ZREM', KEYS[2], o)
    redis.call('HDEL', KEYS[1], o)
  end
end
-- tidy deletes the limit once nobody holds the key or waits for it (the
-- other names vanish with their last member).
local function tidy()
  if redis.call('EXISTS', KEYS[2]) == 0 and redis.call('EXISTS', KEYS[3]) == 0 then
    redis.call('DEL', KEYS[5])
  end
end
-- set_limit records a semaphore's limit, living at least ms.
local function set_limit(lim, ms)
  if tonumber(redis.call('GET', KEYS[5]) or '0') ~= lim then
    redis.call('SET', KEYS[5], lim, 'PX', ms)
  else
    keep(KEYS[5], ms)
  end
end
`

// famAcquireScript is acquireScript for the families: it admits the caller
// if the key has room for it (see the admission rule above), drawing the
// next token from the family's counter of the key; in "wait" mode, when it
// cannot, it queues the caller (or refreshes its entry). A semaphore
// acquisition whose n differs from the key's limit, while the key has
// holders or waiters, is refused.
//
//	KEYS[1..5] as luaFamily, KEYS[6] fence counter
//	ARGV[1] owner token (its first byte the kind), ARGV[2] lease in ms,
//	ARGV[3] clock floor "1"/"0", ARGV[4] fence expiry in ms or "0",
//	ARGV[5] "try" or "wait", ARGV[6] the Locker's id,
//	ARGV[7] the queue entry's lease in ms, ARGV[8] "1" to publish on a shard
//	channel, ARGV[9] the semaphore's n ("0" for a reader-writer lock),
//	ARGV[10] the prefix of the key's wake-up channels
//	returns {1, token}; {0, ms until the first holder's lease ends (-1
//	none), place (-1 for "try")}; or {-1, the key's limit} on a mismatch
//
// place is 0 when one holder's leaving would admit the waiter: it then
// tries again when the first lease runs out, as a crashed holder says
// nothing.
//
// A holder that already carries our owner token means this is the client's
// retry of a request whose reply was lost: the token recorded for it is
// returned, and the lease reset from now (a write, for WithReplicaAck's
// WAIT: see acquireScript).
var famAcquireScript = goredis.NewScript(luaQueue + luaFence + luaFamily + `
if redis.replicate_commands then redis.replicate_commands() end
local now = now_ms()
local owner = ARGV[1]
local kind = kind_of(owner)
local held = redis.call('HGET', KEYS[1], owner)
if held then
  local d = redis.call('ZSCORE', KEYS[2], owner)
  if d and tonumber(d) > now then
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), owner)
    return {1, held}
  end
end
local sem = '0'
local lim = tonumber(ARGV[9])
if lim > 0 then
  sem = '1'
end
local queued = redis.call('EXISTS', KEYS[3]) == 1
local cur = limit_of(sem)
local me = ARGV[6] .. ':' .. owner
local before = {}
if queued then
  before = admissible(sem, cur)
end
prune_holders(now)
if queued then
  prune(KEYS[3], KEYS[4], now)
end
local nh, writer = holding()
local nq = 0
if queued then
  nq = redis.call('ZCARD', KEYS[3])
end
if sem == '1' then
  if (nh > 0 or nq > 0) and cur > 0 and cur ~= lim then
    if queued then
      notify_new(before, admissible(sem, cur), me, ARGV[10], ARGV[8])
    end
    return {-1, cur}
  end
  cur = lim
end
local rank = nil
if queued and ARGV[5] == 'wait' then
  rank = redis.call('ZRANK', KEYS[3], me)
end
local ahead = rank or nq
local fits
if sem == '1' then
  fits = nh + ahead < lim
elseif kind == 'w' then
  fits = nh == 0 and ahead == 0
else
  fits = not writer and not writer_in(ahead)
end
local ttl = tonumber(ARGV[2])
if fits then
  local token, err = next_token(KEYS[6], ARGV[3], ARGV[4])
  if not token then
    return err
  end
  redis.call('HSET', KEYS[1], owner, string.format('%.0f', token))
  redis.call('ZADD', KEYS[2], now + ttl, owner)
  keep(KEYS[1], ttl)
  keep(KEYS[2], ttl)
  if sem == '1' then
    set_limit(lim, ttl)
  end
  if rank then
    redis.call('ZREM', KEYS[3], me)
    redis.call('ZREM', KEYS[4], me)
  end
  if queued then
    notify_new(before, admissible(sem, cur), me, ARGV[10], ARGV[8])
  end
  return {1, token}
end
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local pttl = -1
if first[2] then
  pttl = math.max(tonumber(first[2]) - now, 0)
end
if ARGV[5] == 'try' then
  if queued then
    notify_new(before, admissible(sem, cur), me, ARGV[10], ARGV[8])
  end
  return {0, pttl, -1}
end
if not rank then
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  local seq = 1
  if last[2] then
    seq = tonumber(last[2]) + 1
  end
  redis.call('ZADD', KEYS[3], seq, me)
  rank = nq
end
local lease = tonumber(ARGV[7])
redis.call('ZADD', KEYS[4], now + lease, me)
keep(KEYS[3], lease)
keep(KEYS[4], lease)
if sem == '1' then
  set_limit(lim, lease)
end
notify_new(before, admissible(sem, cur), me, ARGV[10], ARGV[8])
local place = rank
if sem == '1' then
  place = nh + rank - lim
elseif kind == 'w' then
  place = math.max(nh - 1 + rank, 0)
end
return {0, pttl, math.max(place, 0)}
`)

// famReleaseScript ends a holder's lease if it is still live, remembers the
// release (for a retry of it, as releaseScript does) and tells the waiters
// that it, and the pruning of dead entries, made admissible.
//
//	KEYS[1..5] as luaFamily, KEYS[6] recent releases
//	ARGV[1] owner token, ARGV[2] "1" to publish on a shard channel,
//	ARGV[3] how long to remember the release in ms, ARGV[4] the prefix of
//	the key's wake-up channels, ARGV[5] "1" for a semaphore
//	returns 1 when released (now or by an earlier attempt of the same
//	release), 0 when the lease was no longer ours
//
// The holder's entries are removed before anything is written, so that a
// full server (maxmemory, noeviction) still lets it through (see
// releaseScript).
var famReleaseScript = goredis.NewScript(luaQueue + luaFamily + releases.Lua + `
if redis.replicate_commands then redis.replicate_commands() end
local now = now_ms()
local owner = ARGV[1]
local queued = redis.call('EXISTS', KEYS[3]) == 1
local cur = limit_of(ARGV[5])
local before = {}
if queued then
  before = admissible(ARGV[5], cur)
end
local d = redis.call('ZSCORE', KEYS[2], owner)
local mine = d and tonumber(d) > now
if mine then
  redis.call('ZREM', KEYS[2], owner)
  redis.call('HDEL', KEYS[1], owner)
end
prune_holders(now)
if queued then
  prune(KEYS[3], KEYS[4], now)
  notify_new(before, admissible(ARGV[5], cur), nil, ARGV[4], ARGV[2])
end
tidy()
if mine then
  remember_release(KEYS[6], owner, ARGV[3])
  return 1
end
if released_before(KEYS[6], owner) then
  return 1
end
return 0
`)

// famLeaveScript takes a waiter that gives up out of the queue, ends the
// lease an abandoned attempt of it may have taken after all, and tells the
// waiters that this made admissible.
//
//	KEYS[1..5] as luaFamily
//	ARGV[1] owner token, ARGV[2] the Locker's id, ARGV[3] "1" to publish on
//	a shard channel, ARGV[4] the prefix of the key's wake-up channels,
//	ARGV[5] "1" for a semaphore
//	returns 1
var famLeaveScript = goredis.NewScript(luaQueue + luaFamily + `
if redis.replicate_commands then redis.replicate_commands() end
local now = now_ms()
local owner = ARGV[1]
local me = ARGV[2] .. ':' .. owner
local queued = redis.call('EXISTS', KEYS[3]) == 1
local cur = limit_of(ARGV[5])
local before = {}
if queued then
  before = admissible(ARGV[5], cur)
end
redis.call('ZREM', KEYS[2], owner)
redis.call('HDEL', KEYS[1], owner)
if queued then
  redis.call('ZREM', KEYS[3], me)
  redis.call('ZREM', KEYS[4], me)
end
prune_holders(now)
if queued then
  prune(KEYS[3], KEYS[4], now)
  notify_new(before, admissible(ARGV[5], cur), me, ARGV[4], ARGV[3])
end
tidy()
return 1
`)

// famKeys are KEYS[1..5] of the family scripts (see luaFamily).
func (k keys) famKeys(extra string) []string {
	return []string{k.lock, k.leases, k.queue, k.waiters, k.limit, extra}
}

func (k keys) semFlag() string {
	if k.fam == famSemaphore {
		return "1"
	}
	return "0"
}

func (l *Locker) runFamilyAcquire(ctx context.Context, a *attempt) (acquireResult, error) {
	ms, lease := l.ttlArgs(a.ttl)
	args := &l.args
	cmd, acks := l.runScript(ctx, famAcquireScript, a.k.famKeys(a.k.fence),
		a.owner, ms, args.clock, args.fenceExpiry, a.mode, args.id, lease, args.sharded, a.limit, a.k.wakeBase)
	v, err := cmd.Slice()
	if err != nil {
		return acquireResult{}, err
	}
	if len(v) < 2 {
		return acquireResult{}, fmt.Errorf("redis: acquire script returned %d values, want 2 or 3", len(v))
	}
	n := make([]int64, len(v))
	for i, x := range v {
		if n[i], err = replyInt(x); err != nil {
			return acquireResult{}, fmt.Errorf("redis: acquire script: %w", err)
		}
	}
	switch n[0] {
	case 1:
		if n[1] <= 0 {
			return acquireResult{}, fmt.Errorf("redis: fence counter %s returned token %d; it must be positive (was the counter overwritten?)", a.k.fence, n[1])
		}
		if acks >= 0 && acks < int64(l.cfg.replicas) {
			return acquireResult{}, l.notAcked("the acquisition", acks)
		}
		return acquireResult{ok: true, token: n[1]}, nil
	case -1:
		return acquireResult{}, fmt.Errorf("%w: the key is a semaphore of %d, asked for %d", locker.ErrLimitMismatch, n[1], a.limit)
	}
	res := acquireResult{pttl: -1, place: -1}
	if n[1] >= 0 {
		res.pttl = time.Duration(n[1]) * time.Millisecond
	}
	if len(n) > 2 {
		res.place = n[2]
	}
	return res, nil
}

// replyInt reads an integer of a script's reply: a Lua number comes back
// as an integer, a value read from a hash as a string.
func replyInt(x any) (int64, error) {
	switch x := x.(type) {
	case int64:
		return x, nil
	case string:
		return strconv.ParseInt(x, 10, 64)
	}
	return 0, fmt.Errorf("unexpected value %v (%T)", x, x)
}

func (l *Locker) runFamilyRelease(ctx context.Context, k keys, owner string) (bool, error) {
	n, err := famReleaseScript.Run(ctx, l.via(ctx), k.famKeys(k.released), l.famReleaseArgs(k, owner)...).Int64()
	return n == 1, err
}

func (l *Locker) famReleaseArgs(k keys, owner string) []any {
	return []any{owner, l.args.sharded, l.args.remember, k.wakeBase, k.semFlag()}
}

func (l *Locker) runFamilyLeave(ctx context.Context, k keys, owner string) error {
	return famLeaveScript.Run(ctx, l.via(ctx), k.famKeys(k.fence)[:5],
		owner, l.args.id, l.args.sharded, k.wakeBase, k.semFlag()).Err()
}

// runFamilyExtend renews a holder's lease if it is still live: the holder
// entry of extendManyScript, on its own.
func (l *Locker) runFamilyExtend(ctx context.Context, k keys, owner string, ms int64) (bool, error) {
	cmd, acks := l.runScript(ctx, extendManyScript, []string{k.lock, k.leases, k.limit}, "f", owner, ms)
	vals, err := cmd.Int64Slice()
	ok := err == nil && len(vals) == 1 && vals[0] == 1
	if ok && acks >= 0 && acks < int64(l.cfg.replicas) {
		return false, l.notAcked("the renewal", acks)
	}
	return ok, err
}
