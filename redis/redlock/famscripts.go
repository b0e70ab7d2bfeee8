package redlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/redis/internal/releases"
)

// The scripts of the lock families (see families.go), one node each, like
// the mutex's. A family's names on a node all start with its base name B
// (the key's hash tag followed by ":sem" or ":rw", which no mutex name
// does), and the scripts derive them from B (the nodes are independent
// servers, never a Cluster):
//
//	B:n        the semaphore's limit while it has holders or waiters
//	B:s:<i>    permit slot i (0 ≤ i < n): the holder's owner token, as a
//	           mutex's lock key, expiring with its lease
//	B:w        the writer of a reader-writer lock, the same way
//	B:r        its readers: a sorted set of owner tokens scored by the
//	           time (the node's clock, ms) their leases end
//	B:q        the queue: waiter ids scored by their tickets
//	B:qx       the queue entries' leases: waiter ids scored by the time
//	           they end unless the waiter refreshes them
//	B:fence    the node's counter: tickets and tokens come from it
//	B:claims   the tokens claimed on the node: owner tokens scored by
//	           the token each claimed (see famClaimScript)
//	B:released-by:<owner>, as the mutex's (see releases)
//
// A waiter id starts with the mode it waits for ("r" or "w" on a
// reader-writer lock, "p" on a semaphore), so that a reader can tell a
// writer ahead of it.

// luaFamily is the prelude of every family script: KEYS[1] is B.
var luaFamily = luaOurs + releases.Lua + `
if redis.replicate_commands then redis.replicate_commands() end
local B = KEYS[1]
local Q, QX, FENCE, R, W = B .. ':q', B .. ':qx', B .. ':fence', B .. ':r', B .. ':w'
-- (R is readersSuffix in Go.) The mutex (kind 'w' on its own names)
-- passes its lock key as KEYS[3]; it has no readers, and its waiters are
-- all writers, so its scripts skip what only readers need (MUTEX).
local MUTEX = false
if KEYS[3] then W, MUTEX = KEYS[3], true end
-- now_ms reads the node's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function slot_key(i) return B .. ':s:' .. i end
local function counter() return tonumber(redis.call('GET', FENCE) or '0') end
-- extend_to makes key live at least until at (ms, node clock): when it
-- has less, it gets (at - now) times spare (1 when not given).
local function extend_to(key, at, now, spare)
  local p = redis.call('PTTL', key)
  if p == -1 or (p >= 0 and now + p < at) then
    redis.call('PEXPIRE', key, math.max((at - now) * (spare or 1), 1))
  end
end
-- extend_queue does it for the queue's two keys, giving them twice what
-- is needed, so that most refreshes need no PEXPIRE.
local function extend_queue(at, now)
  extend_to(Q, at, now, 2)
  extend_to(QX, at, now, 2)
end
-- purge drops the queue entries and readers whose leases ended, and
-- returns how many queue entries it dropped.
local function purge(now)
  local gone = redis.call('ZRANGEBYSCORE', QX, '-inf', now)
  for _, m in ipairs(gone) do
    redis.call('ZREM', QX, m)
    redis.call('ZREM', Q, m)
  end
  if not MUTEX then redis.call('ZREMRANGEBYSCORE', R, '-inf', now) end
  return #gone
end
-- limit is the semaphore's current limit (0 when none is recorded).
local function limit() return tonumber(redis.call('GET', B .. ':n') or '0') end
-- free_slots lists the free permit slots of a semaphore of n.
local function free_slots(n)
  local f = {}
  for i = 0, n - 1 do
    if redis.call('EXISTS', slot_key(i)) == 0 then f[#f + 1] = i end
  end
  return f
end
-- live tells whether a semaphore has holders or waiters.
local function live()
  if redis.call('ZCARD', Q) > 0 then return true end
  for i = 0, limit() - 1 do
    if redis.call('EXISTS', slot_key(i)) == 1 then return true end
  end
  return false
end
-- set_limit records n as the semaphore's limit, unless holders or waiters
-- have another: then it returns that one.
local function set_limit(n)
  local cur = limit()
  if cur == n then return nil end
  if cur > 0 and live() then return cur end
  redis.call('SET', B .. ':n', n)
  return nil
end
-- wake publishes the ids of the waiters that the node would admit now:
-- the first (free permits) of a semaphore's queue; on a reader-writer lock
-- with no writer, the readers at the head of the queue, or the writer at
-- its head when nobody holds.
-- wfree: the caller knows that no writer holds (it deleted W); head, if
-- given, is the mutex's queue's head as ZRANGE Q 0 0 read it.
local function wake(kind, channel, wfree, head)
  local ids = {}
  if kind == 'p' then
    local free = #free_slots(limit())
    if free > 0 then ids = redis.call('ZRANGE', Q, 0, free - 1) end
  elseif (wfree or redis.call('EXISTS', W) == 0) then
    local readers, upto = 0, 0
    if not MUTEX then readers, upto = redis.call('ZCARD', R), 999 end
    for _, m in ipairs(head or redis.call('ZRANGE', Q, 0, upto)) do
      if string.sub(m, 1, 1) == 'w' then
        if #ids == 0 and readers == 0 then ids = {m} end
        break
      end
      ids[#ids + 1] = m
    end
  end
  if #ids > 0 then
    redis.call('PUBLISH', channel, 'q ' .. table.concat(ids, ' '))
  end
end
-- holds tells whether owner holds B on this node, and in which slot; for
-- kind 'w' it keeps the writer's lock value in WVAL (false: none).
local WVAL
local function holds(kind, owner, now)
  if kind == 'p' then
    for i = 0, limit() - 1 do
      if ours(redis.call('GET', slot_key(i)), owner) then return true, i end
    end
    return false, -1
  elseif kind == 'w' then
    WVAL = redis.call('GET', W)
    return ours(WVAL, owner), 0
  end
  local s = redis.call('ZSCORE', R, owner)
  return s ~= false and tonumber(s) > now, 0
end
`

// famAcquireScript grants a permit, the read lock or the write lock of B
// on one node when the node admits it, in the order of the queue.
//
//	KEYS[1] B, KEYS[2] recent releases
//	ARGV[1] kind: "p" permit, "r" read, "w" write
//	ARGV[2] owner token, ARGV[3] lease (ms), ARGV[4] limit n (permits)
//	ARGV[5] waiter id, or "" for a TryAcquire (behind every waiter)
//	ARGV[6] the waiter's ticket, 0 for an Acquire's first round (behind
//	every waiter; a node that refuses it queues it: see below)
//	ARGV[7] the waiter's entry's lease (ms)
//	ARGV[8] the slot to prefer when free (permits; -1: the lowest)
//	ARGV[9] the key's wake channel
//	returns {1, counter after the grant, slot, free slots}
//	     or {0, ms until a holder's lease ends here (-1: none holds,
//	        and the node refused only for the waiters queued ahead, whom
//	        it reminds: see below), the
//	        writer's owner token ("w", when one holds) or "*", free slots,
//	        the waiter's provisional ticket here (0: none)}
//	     or {0, -1, owner} (a late request of a round given up; see the mutex's grant in scripts.go)
//	     or {-2, the limit of the semaphore's holders and waiters}
//
// A waiter's entry is (re)written with its ticket: the scores of the
// waiters that have run a round are the same on every node, so the nodes
// agree on the order of the queue (see "Lock families" in doc.go). An
// Acquire's first round (ticket 0) joins the queue where it is refused,
// with the node's next counter value as its provisional ticket (the
// waiter's ticket is the one a majority gave, else the largest of a
// majority's). A permit is admitted when fewer waiters are ahead of it than slots are
// free, a reader when no writer holds or waits ahead of it, a writer when
// nobody holds and nobody waits ahead of it. The grant takes the waiter
// out of the queue; a round that fails puts it back (famReleaseScript).
var famAcquireScript = newScript(`
-- The mutex's grant with nobody queued and nobody holding, before the
-- prelude's functions are made (they cost every call that does not use
-- them: issue 32): one EXISTS of the lock, the queue and the release
-- records of the owner token and the waiter id (a round or a wait given
-- up: see the mutex's grant in scripts.go), then INCR and SET, as below.
if KEYS[3] and not (ARGV[5] ~= '' and tonumber(ARGV[6]) > 0) then
  local busy
  if ARGV[5] == '' then
    busy = redis.call('EXISTS', KEYS[3], KEYS[1] .. ':q', ` + releases.Name("KEYS[2]", "ARGV[2]") + `)
  else
    busy = redis.call('EXISTS', KEYS[3], KEYS[1] .. ':q', ` + releases.Name("KEYS[2]", "ARGV[2]") + `, ` + releases.Name("KEYS[2]", "ARGV[5]") + `)
  end
  if busy == 0 then
    local v = redis.call('INCR', KEYS[1] .. ':fence')
    redis.call('SET', KEYS[3], ARGV[2] .. ':' .. v, 'PX', ARGV[3])
    return {1, v, 0, {}}
  end
end
` + luaFamily + `
local kind, owner, ttl, n = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local id, ticket, lease, prefer = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local channel = ARGV[9]
-- The mutex reads the clock and purges its queue only when the queue has
-- entries (qlen: its length, nil when not known): an empty queue has
-- nothing to purge, and a grant with nobody queued needs no time. (A
-- waiter's round with its ticket writes its entry: it reads the clock.)
local now, qlen
if MUTEX and not (id ~= '' and ticket > 0) then
  qlen = redis.call('ZCARD', Q)
  if qlen > 0 then
    now = now_ms()
    if purge(now) > 0 then qlen = nil end
  end
else
  now = now_ms()
  purge(now)
end
local held, slot = holds(kind, owner, now)
if held then
  return {1, counter(), slot, {}}
end
if released_before(KEYS[2], owner) then
  return {0, -1, owner}
end
if kind == 'p' then
  local other = set_limit(n)
  if other then return {-2, other} end
end
local rank, joined, queued
if id ~= '' and released_before(KEYS[2], id) then
  return {0, -1, owner}
end
if id ~= '' and ticket > 0 then
  now = now or now_ms()
  redis.call('ZADD', Q, ticket, id)
  if counter() < ticket then redis.call('SET', FENCE, ticket) end
  redis.call('ZADD', QX, now + lease, id)
  extend_queue(now + lease, now)
  rank = redis.call('ZRANK', Q, id)
  queued = true
else
  if id ~= '' and qlen ~= 0 then joined = redis.call('ZSCORE', Q, id) end
  if joined then
    joined, queued = tonumber(joined), true
    rank = redis.call('ZRANK', Q, id)
  else
    joined = nil
    rank = qlen or redis.call('ZCARD', Q)
  end
end
local ok, wait, free = false, -1, {}
slot = 0
if kind == 'p' then
  free = free_slots(n)
  if rank < #free then
    ok, slot = true, free[1]
    for _, i in ipairs(free) do
      if i == prefer then slot = i end
    end
  elseif #free == 0 then
    for i = 0, n - 1 do
      local p = redis.call('PTTL', slot_key(i))
      if p >= 0 and (wait < 0 or p < wait) then wait = p end
    end
  end
elseif kind == 'w' then
  local wp, first = -2, {}
  if WVAL then wp = redis.call('PTTL', W) end
  if not MUTEX then first = redis.call('ZRANGE', R, 0, 0, 'WITHSCORES') end
  ok = wp == -2 and #first == 0 and rank == 0
  if wp >= 0 then
    wait = wp
  elseif #first > 0 then
    local last = redis.call('ZRANGE', R, -1, -1, 'WITHSCORES')
    wait = math.max(tonumber(last[2]) - now, 0)
  end
else
  local wp = redis.call('PTTL', W)
  ok = wp == -2
  if ok and rank > 0 then
    for _, m in ipairs(redis.call('ZRANGE', Q, 0, rank - 1)) do
      if string.sub(m, 1, 1) == 'w' then ok = false break end
    end
  end
  if wp >= 0 then
    wait = wp
  elseif not ok then
    -- A writer waits ahead: it waits for the readers that hold.
    local last = redis.call('ZRANGE', R, -1, -1, 'WITHSCORES')
    if #last > 0 then wait = math.max(tonumber(last[2]) - now, 0) end
  end
end
if not ok then
  if id ~= '' and ticket == 0 and not joined then
    now = now or now_ms()
    joined = redis.call('INCR', FENCE)
    redis.call('ZADD', Q, joined, id)
    redis.call('ZADD', QX, now + lease, id)
    extend_queue(now + lease, now)
  end
  -- Refused while the node would admit waiters ahead of the caller now:
  -- remind them. The release's wake-up may have named another waiter
  -- (the queue's order was not settled: a waiter's ticket is written on a
  -- node by its first round that reaches it), or gone out before they
  -- subscribed; a waiter refused by a majority with no holder sleeps
  -- only briefly, but one that saw the holder before the release sleeps
  -- until its refresh or the end of the holder's lease.
  if wait < 0 then wake(kind, channel) end
  -- The writer's owner token when one holds (a mutex's round tells a
  -- holder of a majority from contenders that split the nodes), else '*'.
  local holder = '*'
  if kind == 'w' then holder = WVAL or '*' end
  return {0, wait, holder, free, joined or 0}
end
local v = redis.call('INCR', FENCE)
if queued then
  redis.call('ZREM', Q, id)
  redis.call('ZREM', QX, id)
end
if kind == 'p' then
  redis.call('SET', slot_key(slot), owner, 'PX', ttl)
elseif kind == 'w' then
  redis.call('SET', W, owner .. ':' .. v, 'PX', ttl)
else
  redis.call('ZADD', R, now + ttl, owner)
  extend_to(R, now + ttl, now)
end
return {1, v, slot, free}
`)

// famEnqueueScript puts a waiter in B's queue on one node, with the
// node's next counter value as its provisional ticket (the waiter's ticket
// is the one a majority gave, else the largest of a majority's, written
// back by its first admission round).
//
//	KEYS[1] B, KEYS[2] recent releases; ARGV[1] kind, ARGV[2] waiter id,
//	ARGV[3] entry lease (ms), ARGV[4] limit n (permits)
//	returns {1, ticket}, {-2, the limit of the holders and waiters}, or
//	{0, 0} when the waiter has left the queue already (a late request)
var famEnqueueScript = newScript(luaFamily + `
local kind, id, lease, n = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
purge(now)
if released_before(KEYS[2], id) then
  return {0, 0}
end
if kind == 'p' then
  local other = set_limit(n)
  if other then return {-2, other} end
end
local t = redis.call('ZSCORE', Q, id)
if not t then
  t = redis.call('INCR', FENCE)
  redis.call('ZADD', Q, t, id)
end
redis.call('ZADD', QX, now + lease, id)
extend_queue(now + lease, now)
return {1, tonumber(t)}
`)

// famClaimScript is a family's write-back: it claims the token for the
// grant's owner on one node, while the grant is still there, unless
// another owner claimed the same token on the node (see "Fencing tokens"
// in doc.go: two holders that hold at once, readers or permits, may take
// the same largest value of a majority's counters; a value two majorities
// accepted would have been accepted twice on a node they share).
//
//	KEYS[1] B; ARGV[1] kind, ARGV[2] owner token, ARGV[3] token
//	returns {1} when claimed (now, or by an earlier copy of this request:
//	the counter is then at least the token),
//	{0} when the grant was not there (nothing changed),
//	{-1, a fresh counter value} when the token is another owner's here
//
// B:claims holds the claims, one per owner (its latest token), scored by
// token. A claim replaces the owner's own claim of a lower token (a round
// that retried with a larger one); a claim of a lower token than the
// owner's own is a late copy of an earlier request, and refused. The set
// keeps the latest maxClaims claims: once it holds that many, a token
// below all of them is refused as if claimed (its claim may have been
// trimmed). It lives as long as the longest lease of the lock's holders
// on the node when a claim was made: only a holder granted before a claim
// can claim the same token later (a later grant increments the counter,
// which every claim raised to its token, so its token is greater), and it
// can claim only while it holds.
//
// A refusal increments the counter and returns it, as a grant does: the
// retry takes the largest of the values the refusing nodes returned, so
// that owners refused together pick different tokens, as often as grants
// do.
var famClaimScript = newScript(luaFamily + `
local kind, owner, token = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local held, slot = holds(kind, owner, now)
if not held then return {0} end
local cur = tonumber(redis.call('GET', FENCE) or '0')
if cur == nil then
  return redis.error_reply('fence counter ' .. FENCE .. ' does not hold a number')
end
local C = B .. ':claims'
local mine = tonumber(redis.call('ZSCORE', C, owner) or '0')
if mine ~= token then
  local free = mine < token and #redis.call('ZRANGEBYSCORE', C, ARGV[3], ARGV[3], 'LIMIT', 0, 1) == 0
  if free and redis.call('ZCARD', C) >= ` + strconv.Itoa(maxClaims) + ` then
    local low = redis.call('ZRANGE', C, 0, 0, 'WITHSCORES')
    free = token > tonumber(low[2])
  end
  if not free then
    return {-1, redis.call('INCR', FENCE)}
  end
  redis.call('ZADD', C, ARGV[3], owner)
  redis.call('ZREMRANGEBYRANK', C, 0, -` + strconv.Itoa(maxClaims+1) + `)
end
local left = 1
if kind == 'p' then
  for i = 0, limit() - 1 do
    left = math.max(left, redis.call('PTTL', slot_key(i)))
  end
else
  left = math.max(left, redis.call('PTTL', W))
  local last = redis.call('ZRANGE', R, -1, -1, 'WITHSCORES')
  if #last > 0 then left = math.max(left, tonumber(last[2]) - now) end
end
extend_to(C, now + left, now)
if cur < token then redis.call('SET', FENCE, ARGV[3]) end
local key = nil
if kind == 'p' then key = slot_key(slot) elseif kind == 'w' then key = W end
if key then
  local pttl = redis.call('PTTL', key)
  if pttl > 0 then redis.call('SET', key, owner .. ':' .. ARGV[3], 'PX', pttl) end
end
return {1}
`)

// maxClaims is how many claims of tokens a node keeps per family lock
// (see famClaimScript): far more than the holders that acquire at once.
const maxClaims = 1024

// A node's answer to a claim (famClaimScript).
const (
	claimGone     = 0  // the grant was not there
	claimAccepted = 1  // the token is ours on the node
	claimTaken    = -1 // another owner claimed it; counter is a fresh value
)

// runClaim claims token for owner on one node: claimAccepted,
// claimGone, or claimTaken with a fresh counter value of the node.
func runClaim(ctx context.Context, c goredis.UniversalClient, k keys, owner string, token int64) (state int, counter int64, err error) {
	v, err := runScript(ctx, c, famClaimScript, []string{k.base}, k.famKind(), owner, famToken(token)).Slice()
	if err != nil {
		return 0, 0, err
	}
	if len(v) < 1 {
		return 0, 0, fmt.Errorf("claim script returned no value")
	}
	flag, _ := v[0].(int64)
	switch flag {
	case claimAccepted, claimGone:
		return int(flag), 0, nil
	case claimTaken:
		if len(v) >= 2 {
			if n, ok := v[1].(int64); ok && n > 0 {
				return claimTaken, n, nil
			}
		}
	}
	return 0, 0, fmt.Errorf("claim script returned %v", v)
}

// famExtendScript renews a reader's lease on one node if it is still
// there, in a round of its own (a permit's and a writer's are renewed by
// extendScript, on their own keys; in a batch, extendManyScript's "r"
// entries do the same for many readers).
//
//	KEYS[1] B; ARGV[1] owner token, ARGV[2] lease (ms)
//	returns 1 when renewed, 0 when the reader was not there
var famExtendScript = newScript(luaFamily + `
local now = now_ms()
local held = holds('r', ARGV[1], now)
if not held then return 0 end
redis.call('ZADD', R, 'XX', now + tonumber(ARGV[2]), ARGV[1])
extend_to(R, now + tonumber(ARGV[2]), now)
return 1
`)

// famReleaseScript gives a family's grant up on one node (owner-checked,
// remembered as the mutex's release is: see scripts.go), and says what
// becomes of the caller's queue entry.
//
//	KEYS[1] B, KEYS[2] recent releases
//	ARGV[1] kind, ARGV[2] owner token, ARGV[3] channel,
//	ARGV[4] "1" to wake the waiters the release admits,
//	ARGV[5] how long to remember the release (ms),
//	ARGV[6] waiter id ("" none), ARGV[7] "keep": put the waiter back in
//	the queue with ARGV[8] its ticket and ARGV[9] its entry's lease (ms)
//	(a round that failed), "drop": take it out (a wait that ended)
//	returns 1 when deleted (now, or by an earlier attempt), 0 when the
//	grant was not there
//
// A waiter taken out of the queue wakes the waiters it held back (a
// writer that gave up its wait lets the readers behind it in), whatever
// ARGV[4] says.
var famReleaseScript = newScript(`
-- The mutex's release with nobody queued and no queue entry of the
-- caller's, before the prelude's functions are made (see
-- famAcquireScript): GET, EXISTS, DEL and the record, as below (which
-- would wake nobody).
if KEYS[3] and ARGV[6] == '' then
  local v, o = redis.call('GET', KEYS[3]), ARGV[2]
  if (` + oursExpr("v", "o") + `)
      and redis.call('EXISTS', KEYS[1] .. ':q') == 0 then
    redis.call('DEL', KEYS[3])
    ` + releases.Remember("KEYS[2]", "o", "ARGV[5]") + `
    return 1
  end
end
` + luaFamily + `
local kind, owner, channel, announce, ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local id, what = ARGV[6], ARGV[7]
local now = now_ms()
-- The mutex's release with no queue entry of the caller's to keep or drop
-- purges the queue only when it has entries, and wakes its head as read
-- then (head: nil when not read, or when the purge dropped entries).
local head
if MUTEX and id == '' then
  head = redis.call('ZRANGE', Q, 0, 0)
  if #head > 0 and purge(now) > 0 then head = nil end
else
  purge(now)
end
local held, slot = holds(kind, owner, now)
if held then
  if kind == 'p' then redis.call('DEL', slot_key(slot))
  elseif kind == 'w' then redis.call('DEL', W)
  else redis.call('ZREM', R, owner) end
end
local left = false
if id ~= '' and what == 'keep' and not released_before(KEYS[2], id) then
  local lease = tonumber(ARGV[9])
  redis.call('ZADD', Q, 'NX', tonumber(ARGV[8]), id)
  redis.call('ZADD', QX, now + lease, id)
  extend_queue(now + lease, now)
elseif id ~= '' and what == 'drop' then
  left = redis.call('ZREM', Q, id) == 1
  redis.call('ZREM', QX, id)
  remember_release(KEYS[2], id, ms)
end
if kind == 'p' and not live() then
  redis.call('DEL', B .. ':n')
end
if not held then
  if left then wake(kind, channel) end
  if released_before(KEYS[2], owner) then return 1 end
  if announce ~= '1' then remember_release(KEYS[2], owner, ms) end
  return 0
end
remember_release(KEYS[2], owner, ms)
if announce == '1' or left then wake(kind, channel, kind == 'w', head) end
return 1
`)

// famKind is the kind argument of the family scripts.
func (k keys) famKind() string {
	switch k.kind {
	case permitLock:
		return "p"
	case readLock:
		return "r"
	default: // writeLock, and mutexLock: the mutex is a writer on its own names
		return "w"
	}
}

// famArgsAcquire are the acquire script's arguments.
func famArgsAcquire(k keys, owner string, ttl time.Duration, q *queued, prefer int) []any {
	id, ticket, lease := "", int64(0), int64(0)
	if q != nil {
		id, ticket, lease = q.id, q.ticket, millis(q.lease)
	}
	return []any{k.famKind(), owner, millis(ttl), k.n, id, ticket, lease, prefer, k.channel}
}

// famKeys are the family scripts' keys: the mutex adds its lock key, which
// the scripts use as the writer's (kind "w").
func (k keys) famKeys() []string {
	if k.kind == mutexLock {
		return []string{k.base, k.released, k.lock}
	}
	return []string{k.base, k.released}
}

// famAcquireReply reads the family acquire script's reply.
func famAcquireReply(k keys, v []any, err error) (grant, error) {
	if err != nil {
		return grant{}, err
	}
	if len(v) >= 2 {
		if flag, _ := v[0].(int64); flag == -2 {
			n, _ := v[1].(int64)
			return grant{mismatch: int(n)}, nil
		}
	}
	g, err := acquireReply(k, v, nil)
	if err != nil {
		return g, err
	}
	if len(v) >= 4 {
		if g.ok {
			s, _ := v[2].(int64)
			g.slot = int(s)
		}
		if free, ok := v[3].([]any); ok {
			for _, f := range free {
				if i, ok := f.(int64); ok {
					g.free = append(g.free, int(i))
				}
			}
		}
	}
	if len(v) >= 5 && !g.ok {
		g.ticket, _ = v[4].(int64)
	}
	return g, nil
}

// runEnqueue puts waiter q in k's queue on one node and returns its
// provisional ticket there, or the other limit of a semaphore's holders
// (mismatch > 0).
func runEnqueue(ctx context.Context, c goredis.UniversalClient, k keys, q *queued) (ticket int64, mismatch int, err error) {
	v, err := runScript(ctx, c, famEnqueueScript, k.famKeys(), k.famKind(), q.id, millis(q.lease), k.n).Slice()
	if err != nil {
		return 0, 0, err
	}
	if len(v) < 2 {
		return 0, 0, fmt.Errorf("enqueue script returned %d values, want 2", len(v))
	}
	flag, _ := v[0].(int64)
	n, _ := v[1].(int64)
	if flag == -2 {
		return 0, int(n), nil
	}
	return n, 0, nil
}

// runFamRelease gives our grant up on one node; q, if not nil, is the
// waiter to put back in the queue (keep) or take out of it (drop).
func runFamRelease(ctx context.Context, c goredis.UniversalClient, k keys, owner string, announce bool, q *queued, what string) (bool, error) {
	id, ticket, lease := "", int64(0), int64(0)
	if q != nil {
		id, ticket, lease = q.id, q.ticket, millis(q.lease)
	}
	if what == queueKeep && ticket == 0 {
		what = "" // a first round: the waiter has no ticket to keep yet
	}
	a := "0"
	if announce {
		a = "1"
	}
	n, err := runScript(ctx, c, famReleaseScript, k.famKeys(), k.famKind(), owner, k.channel, a, millis(releaseMemory),
		id, what, ticket, lease).Int64()
	return n == 1, err
}

// What the family release script does with the caller's queue entry.
const (
	queueKeep = "keep"
	queueDrop = "drop"
)

// wakeTargets reads a family's wake message ("q id id ..."): the waiters
// it names, or nil for a message that wakes every waiter (the mutex's).
func wakeTargets(payload string) []string {
	rest, ok := strings.CutPrefix(payload, "q ")
	if !ok {
		return nil
	}
	return strings.Fields(rest)
}

// famToken renders a token for the scripts.
func famToken(t int64) string { return strconv.FormatInt(t, 10) }
