package redis

import (
	"context"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/internal/lease"
	"github.com/go-locker/locker/redis/internal/releases"
)

// The scripts run atomically on the server, so no other client can act
// between their check and their effect. Each touches only keys that share one
// hash tag (see keysFor in locker.go), so they run unchanged on Redis Cluster,
// where a script may only use keys of one slot. Keys are always passed in
// KEYS, the lock first, so that cluster clients route the script to the
// slot's master. The wake-up channels are derived from the lock's name (see
// luaQueue): they carry the same hash tag, so a sharded publish from the
// script stays in its slot.

// luaQueue is shared by the scripts that use the waiters' queue of a key.
//
// The queue is two sorted sets next to the lock: KEYS "queue" holds each
// waiter's entry scored by arrival (the last score plus one), "waiters" the
// same entries scored by their deadline, in milliseconds of the server
// clock. An entry is "<Locker id>:<owner token>": the Locker id names the
// Pub/Sub channel on which that Locker hears that it is its waiter's turn
// ("<tag>:wake:<Locker id>" beside the lock "<tag>:lock", so in the key's
// hash slot), the owner token is the one the waiter's lock will carry. A waiter refreshes its deadline
// with every attempt; an entry past its deadline belongs to a waiter that
// died or was cut off, and the scripts drop it (prune) before they look at
// the queue.
//
// The scripts call TIME, so they must replicate their effects rather than
// themselves; redis.replicate_commands does that on Redis 5 and 6 (7 always
// does) and must come before the first write.
const luaQueue = `
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function prune(queue, waiters, now)
  local dead = redis.call('ZRANGEBYSCORE', waiters, '-inf', now)
  for _, m in ipairs(dead) do
    redis.call('ZREM', waiters, m)
    redis.call('ZREM', queue, m)
  end
  return #dead
end
local function head_of(queue)
  return redis.call('ZRANGE', queue, 0, 0)[1]
end
local function notify(base, entry, sharded)
  local lid, owner = string.match(entry, '^([^:]*):(.*)$')
  if not lid then
    return
  end
  local channel = base .. lid
  if sharded == '1' then
    redis.pcall('SPUBLISH', channel, owner)
  else
    redis.call('PUBLISH', channel, owner)
  end
end
local function wake(queue, sharded)
  local head = head_of(queue)
  if not head then
    return
  end
  notify(string.sub(KEYS[1], 1, -5) .. 'wake:', head, sharded)
end
`

// luaFence draws the next fencing token from a key's counter: INCR, or
// with the clock floor (WithClockTokens) max(counter + 1, server time in
// µs), kept with the counter's idle expiry (WithFenceExpiry). It returns
// the token, or nil and an error reply when the counter holds something
// else than a number. It is shared by the mutex's and the families'
// acquire scripts (see acquireScript for why it is built this way).
//
//	next_token(fence, clock "1"/"0", expiry ms or "0")
const luaFence = `
local function next_token(fence, clock, expiry)
  if clock ~= '1' then
    return redis.call('INCR', fence)
  end
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local cur = tonumber(redis.call('GET', fence) or '0')
  if cur == nil then
    return nil, redis.error_reply('fence counter ' .. fence .. ' does not hold a number')
  end
  local token = math.max(cur + 1, floor)
  if expiry ~= '0' then
    redis.call('SET', fence, string.format('%.0f', token), 'PX', expiry)
  else
    redis.call('SET', fence, string.format('%.0f', token))
  end
  return token
end
`

// acquireScript takes the lock and, only then, draws the next fencing token;
// in "wait" mode, when it cannot, it puts the waiter in the key's queue (or
// refreshes its entry there).
//
//	KEYS[1] lock key, KEYS[2] fence counter, KEYS[3] queue, KEYS[4] waiters
//	ARGV[1] owner token, ARGV[2] lease in milliseconds,
//	ARGV[3] "1" to raise the token to at least the server clock in µs,
//	ARGV[4] with ARGV[3]: the fence counter's idle expiry in ms, "0" none
//	ARGV[5] "try" (one attempt) or "wait" (an Acquire that may queue),
//	ARGV[6] the Locker's id (the waiter's queue entry is id:owner),
//	ARGV[7] how long the entry lives without a refresh, in ms,
//	ARGV[8] "1" to publish on a shard channel (Cluster)
//	returns {1, fencing token}, or {0, PTTL of the current holder (-1
//	when the lock is free but the queue's head has its turn, or when the
//	waiter is not the head), the waiter's place in the queue (0 is the
//	head; -1 for "try")}
//
// A free lock goes to a "try" whatever the queue holds (TryAcquire fails
// only when another client holds the key), and to a "wait" only when the
// queue is empty or the waiter is at its head: Acquires are served in the
// order they came. When dropping dead entries makes another waiter the head
// of a free lock, that waiter is told (the release told the dead one).
//
// The script does no more than each case needs (issue 32: it used to run
// about 14 commands to queue a waiter and 10 to let the head in). A free
// key with nobody queued (the queue's keys vanish with their last entry;
// a "try" does not look at the queue) costs one EXISTS of both, then INCR
// and SET; a key found held, EXISTS, GET and PTTL for a "try". The head of
// the queue that was told its turn came takes the lock with EXISTS, GET,
// ZRANGE (it is the head: nobody dead is ahead of it, so nothing to drop
// and no clock to read), INCR, SET and its two ZREMs. A waiter that finds
// the key held joins the queue with EXISTS, GET, TIME, ZRANGEBYSCORE
// (dropping the dead), ZADD NX (its place is kept when it is queued
// already: no ZSCORE to ask first, its arrival scored by the server clock
// in µs, so no ZRANGE for the last score), ZADD of its deadline, PTTL of
// the queue, ZRANK, and the holder's PTTL only when it is the head (the
// only waiter that uses it). The queue's keys are given twice the entry's
// lease whenever less than one lease is left, so that most refreshes need
// no PEXPIRE.
//
// The uncontended case (a free key, nobody queued, tokens from the counter
// alone) runs first, before the script makes its functions (luaQueue's,
// luaFence's, and its own), which cost the server time on every call, used
// or not (issue 32; see releaseScript), and it asks one EXISTS of the
// lock and the queue rather than reading them (GET, ZRANGE): a command
// less on every uncontended acquire, a command more on every contended
// attempt, which reads them after. It writes nothing before it knows
// that it needs no clock, so that on Redis 5 and 6 the script may still
// turn to replicating its effects (redis.replicate_commands, before the
// first write) when it reads the clock.
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
// advances it. The retry resets the lease (PEXPIRE: the lease the client
// counts starts no earlier than the retry), which is also a write: with
// WithReplicaAck the WAIT after it, maybe on another connection than the
// first attempt's, then waits for a replication offset past the first
// attempt's writes (WAIT counts from the connection's last write; a
// connection without one would be confirmed at once).
//
// The queue's two keys expire at most two entry leases after the last
// deadline in them has passed (each refresh leaves them at least the
// entry's lease), so a queue whose waiters all died leaves nothing behind.
// The arrival score is the server clock in µs (a clock stepped back only
// puts a later arrival ahead); Lockers of earlier versions score an entry
// the last score plus one, which keeps the order when both queue on a key.
var acquireScript = goredis.NewScript(`
if ARGV[3] ~= '1' then
  local busy
  if ARGV[5] == 'try' then
    busy = redis.call('EXISTS', KEYS[1])
  else
    busy = redis.call('EXISTS', KEYS[1], KEYS[3])
  end
  if busy == 0 then
    -- Nobody holds, nobody is queued, the token is the counter's: the
    -- uncontended case, before the functions are made (see the comment).
    local token = redis.call('INCR', KEYS[2])
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return {1, token}
  end
end
local holder = redis.call('GET', KEYS[1])
local before
if not holder and ARGV[5] ~= 'try' then
  before = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
end
` + luaQueue + luaFence + `
if redis.replicate_commands then redis.replicate_commands() end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('GET', KEYS[2]))}
end
local function take()
  local token, err = next_token(KEYS[2], ARGV[3], ARGV[4])
  if not token then
    return err
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, token}
end
if ARGV[5] == 'try' then
  if not holder then
    return take()
  end
  return {0, redis.call('PTTL', KEYS[1]), -1}
end
local me = ARGV[6] .. ':' .. ARGV[1]
-- The head's turn: the lock and the queue entry go in one step.
local function take_turn()
  local res = take()
  if res[1] == 1 then
    redis.call('ZREM', KEYS[3], me)
    redis.call('ZREM', KEYS[4], me)
  end
  return res
end
if not holder then
  if not before then
    return take() -- nobody queued (clock tokens: see the fast path)
  end
  if before == me then
    return take_turn()
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local head = before
if prune(KEYS[3], KEYS[4], now) > 0 and not holder then
  head = head_of(KEYS[3])
  if not head then
    return take()
  end
  if head == me then
    return take_turn()
  end
end
local lease = tonumber(ARGV[7])
redis.call('ZADD', KEYS[3], 'NX', tonumber(t[1]) * 1000000 + tonumber(t[2]), me)
redis.call('ZADD', KEYS[4], now + lease, me)
if redis.call('PTTL', KEYS[3]) < lease then
  redis.call('PEXPIRE', KEYS[3], 2 * lease)
  redis.call('PEXPIRE', KEYS[4], 2 * lease)
end
local place = redis.call('ZRANK', KEYS[3], me)
if holder then
  if place == 0 then
    return {0, redis.call('PTTL', KEYS[1]), 0}
  end
  return {0, -1, place}
end
if head ~= before then
  wake(KEYS[3], ARGV[8])
end
return {0, -1, place}
`)

// releaseScript deletes the lock only if it still carries our owner token,
// and then, in the same atomic step, tells the first live waiter in the
// key's queue, and only it, that its turn has come.
//
//	KEYS[1] lock key, KEYS[2] the key's record prefix (see package
//	releases), KEYS[3] queue, KEYS[4] waiters
//	ARGV[1] owner token, ARGV[2] "1" to publish on a shard channel (Cluster),
//	ARGV[3] how long to remember the release, in milliseconds
//	returns 1 when released (now or by an earlier attempt of the same
//	release), 0 when the lock was no longer ours
//
// The release is remembered (a record of its own, KEYS[2] followed by the
// owner token, for ARGV[3]; see package releases) because go-redis retries
// a request whose reply was lost (a connection reset, a read timeout), and
// so does exec after an inline attempt timed out: the retry finds the lock
// gone, and without the record it would report a release that succeeded as
// a lost lock. A record per release, not one per key: the next holder may
// take the key and release it before the retry comes, and its record must
// not hide ours (TestReleaseRetriedAfterNextHolderReleased).
// The record is written after the DEL, which matters on a server that is
// full (maxmemory under noeviction refuses every write that may grow
// memory): Redis refuses such a write only as a script's first write, since
// it cannot stop a script midway, so the writes after the DEL always
// succeed and the release, which frees memory, always happens
// (TestFullServerUnderNoeviction). It runs under redis.call, not pcall:
// pcall measured 4-6% of an uncontended Acquire+Release on loopback (see
// BENCHMARKS.md), and has nothing to catch here. Dropping dead queue
// entries (ZREM) frees memory too.
//
// With nobody queued (no head), the release is GET, ZRANGE, DEL and the
// record's SET, and it runs before the script defines its functions (the
// queue's, luaQueue), which cost the server time on every call where they
// are not used: issue 32 measured the uncontended Acquire+Release's server
// time on Redis 7.0 at 53 µs before this and the acquire script's fast path
// (its record then four commands, TIME, ZADD, ZREMRANGEBYRANK, PEXPIRE),
// 38 µs after, against 20 µs for the least a fenced lock costs. With
// waiters the dead entries go (ZRANGEBYSCORE, after TIME), and the head is
// read again only when some did; then PUBLISH.
//
// SPUBLISH runs under pcall: on a server without it (Redis < 7) the release
// must still succeed, since the DEL cannot be rolled back; waiters then wake
// by their timers.
//
// The fast path writes nothing before it knows that it needs no clock, so
// that on Redis 5 and 6 the script may still turn to replicating its
// effects (redis.replicate_commands, before the first write) when it reads
// the clock.
var releaseScript = goredis.NewScript(`
local ours = redis.call('GET', KEYS[1]) == ARGV[1]
local head
if ours then
  head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not head then -- nobody queued: the uncontended case
    redis.call('DEL', KEYS[1])
    ` + releases.Remember("KEYS[2]", "ARGV[1]", "ARGV[3]") + `
    return 1
  end
end
` + luaQueue + releases.Lua + `
if not ours then
  if released_before(KEYS[2], ARGV[1]) then
    return 1
  end
  return 0
end
if redis.replicate_commands then redis.replicate_commands() end
redis.call('DEL', KEYS[1])
remember_release(KEYS[2], ARGV[1], ARGV[3])
local now = now_ms()
if prune(KEYS[3], KEYS[4], now) > 0 then
  head = head_of(KEYS[3])
end
if head then
  notify(string.sub(KEYS[1], 1, -5) .. 'wake:', head, ARGV[2])
end
return 1
`)

// leaveScript takes a waiter that gives up (its context ended, its Locker
// closed, an attempt failed) out of the key's queue, and deletes the lock if
// an attempt of that waiter took it after all (a request abandoned in
// flight that reached the server). When that frees the lock, or the waiter
// was the head of a free lock (a release may have told it, and not the
// next), it passes the turn on to the next live waiter.
//
//	KEYS[1] lock key, KEYS[2] queue, KEYS[3] waiters
//	ARGV[1] owner token, ARGV[2] the Locker's id,
//	ARGV[3] "1" to publish on a shard channel (Cluster)
//	returns 1
var leaveScript = goredis.NewScript(luaQueue + `
if redis.replicate_commands then redis.replicate_commands() end
local me = ARGV[2] .. ':' .. ARGV[1]
local freed = false
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  freed = true
end
local head = head_of(KEYS[2])
redis.call('ZREM', KEYS[2], me)
redis.call('ZREM', KEYS[3], me)
if (freed or head == me) and redis.call('EXISTS', KEYS[1]) == 0 then
  prune(KEYS[2], KEYS[3], now_ms())
  wake(KEYS[2], ARGV[3])
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

// extendManyScript renews many locks in one call: the renewals of a
// Locker's locks that come due together (renewMany), mutexes as
// extendScript; a family's holder (alone too: runFamilyExtend) if its
// lease in the leases set is still live, which it moves, and the key's
// holders, leases and limit keys live at least as long.
//
//	ARGV, per lock in turn: its kind ("m" mutex: one key, its lock; "f" a
//	family's holder: three keys, its holders, leases and limit), its owner
//	token, its lease in milliseconds
//	KEYS the locks' keys in the same order (on a Cluster, of one hash slot)
//	returns, per lock, 1 when extended, 0 when it was no longer ours (or
//	its key was of another type)
var extendManyScript = goredis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
local now
local function mutex(k, owner, ttl)
  if redis.call('GET', KEYS[k]) == owner then
    return redis.call('PEXPIRE', KEYS[k], ttl)
  end
  return 0
end
local function holder(k, owner, ttl)
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local d = redis.call('ZSCORE', KEYS[k+1], owner)
  if not d or tonumber(d) <= now then
    return 0
  end
  redis.call('ZADD', KEYS[k+1], now + ttl, owner)
  for j = k, k + 2 do
    local p = redis.call('PTTL', KEYS[j])
    if p ~= -2 and p < ttl then
      redis.call('PEXPIRE', KEYS[j], ttl)
    end
  end
  return 1
end
local r, k = {}, 1
for i = 1, #ARGV, 3 do
  local f, n = mutex, 1
  if ARGV[i] ~= 'm' then f, n = holder, 3 end
  -- A key of another type (written over from outside) fails its own
  -- entry, not the batch: the lock is not ours.
  local ok, v = pcall(f, k, ARGV[i+1], tonumber(ARGV[i+2]))
  if ok then r[#r+1] = v else r[#r+1] = 0 end
  k = k + n
end
return r
`)

// renewMany renews the leases of hs in one script call (lease.Batcher's
// Send): a verdict per handle, or an error for them all. With
// WithReplicaAck, a batch that too few replicas confirmed fails as a whole,
// as one renewal would.
func (l *Locker) renewMany(ctx context.Context, hs []*Handle, report func(int, lease.Verdict)) error {
	if len(hs) == 1 {
		// The lock's own script: no list to walk.
		ok, err := hs[0].renewOne(ctx)
		report(0, lease.Verdict{OK: ok, Err: err})
		return nil
	}
	keys := make([]string, 0, len(hs))
	args := make([]any, 0, 3*len(hs))
	for _, h := range hs {
		if h.k.fam == famMutex {
			keys = append(keys, h.k.lock)
			args = append(args, "m", h.owner, millis(h.c.TTL))
		} else {
			keys = append(keys, h.k.lock, h.k.leases, h.k.limit)
			args = append(args, "f", h.owner, millis(h.c.TTL))
		}
	}
	var res []lease.Verdict
	err := l.execBackground(ctx, func(ctx context.Context) error {
		cmd, acks := l.runScript(ctx, extendManyScript, keys, args...)
		vals, err := cmd.Int64Slice()
		if err != nil {
			return err
		}
		if len(vals) != len(hs) {
			return fmt.Errorf("redis: the batched renewal of %d locks answered %d verdicts", len(hs), len(vals))
		}
		out := make([]lease.Verdict, len(vals))
		for i, v := range vals {
			out[i].OK = v == 1
			if out[i].OK && acks >= 0 && acks < int64(l.cfg.replicas) {
				return l.notAcked("the renewal", acks)
			}
		}
		res = out
		return nil
	})
	switch {
	case err == nil:
		for i, v := range res {
			report(i, v)
		}
		return nil
	case goredis.HasErrorPrefix(err, "CROSSSLOT") || goredis.HasErrorPrefix(err, "TRYAGAIN"):
		// A server in cluster mode behind a plain client refuses keys of
		// several slots in one script (CROSSSLOT): batches keep to one
		// slot from now on. A Cluster resharding the slot (TRYAGAIN)
		// redirects single keys, not a batch. This batch: one by one.
		if goredis.HasErrorPrefix(err, "CROSSSLOT") {
			l.slotBatches.Store(true)
		}
		for i, h := range hs {
			ok, err := h.renewOne(ctx)
			report(i, lease.Verdict{OK: ok, Err: err})
		}
		return nil
	default:
		// An abandoned request may still write res: do not read it.
		return err
	}
}

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
	pttl  time.Duration // when !ok: the holder's remaining lease; <0 unknown or free
	place int64         // when !ok in wait mode: the place in the queue, 0 the head
}

// Modes of acquireScript.
const (
	modeTry  = "try"  // one attempt: takes a free lock, never queues
	modeWait = "wait" // an Acquire: queues, and takes a free lock only in turn
)

// scriptArgs are the script arguments that are the same for every call of
// a Locker, converted to interface values once: each conversion of a
// non-constant value allocates, and an uncontended Acquire and Release
// would otherwise pay for them every time.
type scriptArgs struct {
	clock       any // ARGV "1" for WithClockTokens, else "0"
	fenceExpiry any // ms
	sharded     any // "1" on Cluster
	id          any // the Locker's id
	remember    any // releaseMemory in ms
	ttl, lease  any // for the Locker's default TTL: ms, and queueLease in ms
}

func (l *Locker) initArgs() {
	clock := "0"
	if l.cfg.clockTokens {
		clock = "1"
	}
	l.args = scriptArgs{
		clock: clock, fenceExpiry: millis(l.cfg.fenceExpiry), sharded: l.shardedFlag(),
		id: l.id, remember: millis(releaseMemory),
		ttl: millis(l.cfg.TTL), lease: millis(queueLease(l.cfg.TTL)),
	}
}

// ttlArgs returns ttl and its queue lease in ms as script arguments.
func (l *Locker) ttlArgs(ttl time.Duration) (ms, lease any) {
	if ttl == l.cfg.TTL {
		return l.args.ttl, l.args.lease
	}
	return millis(ttl), millis(queueLease(ttl))
}

func (l *Locker) runAcquire(ctx context.Context, k *keys, owner any, mode string, ttl time.Duration) (acquireResult, error) {
	ms, lease := l.ttlArgs(ttl)
	a, kv := &l.args, k.args()
	cmd, acks := l.runScriptArgs(ctx, acquireScript, []any{"evalsha", acquireSHA, "4", kv.lock, kv.fence, kv.queue, kv.waiters,
		owner, ms, a.clock, a.fenceExpiry, modeArg(mode), a.id, lease, a.sharded})
	v, err := cmd.Int64Slice()
	if err != nil {
		return acquireResult{}, err
	}
	if len(v) < 2 {
		return acquireResult{}, fmt.Errorf("redis: acquire script returned %d values, want 2 or 3", len(v))
	}
	if v[0] == 1 {
		if v[1] <= 0 {
			return acquireResult{}, fmt.Errorf("redis: fence counter %s returned token %d; it must be positive (was the counter overwritten?)", k.fence, v[1])
		}
		if acks >= 0 && acks < int64(l.cfg.replicas) {
			return acquireResult{}, l.notAcked("the acquisition", acks)
		}
		return acquireResult{ok: true, token: v[1]}, nil
	}
	res := acquireResult{pttl: -1, place: -1}
	if v[1] >= 0 {
		res.pttl = time.Duration(v[1]) * time.Millisecond
	}
	if len(v) > 2 {
		res.place = v[2]
	}
	return res, nil
}

// runRelease runs the release script; owner is a string, or one already
// converted to an interface (see evalsha).
func (l *Locker) runRelease(ctx context.Context, k *keys, owner any) (bool, error) {
	if k.fam != famMutex {
		return l.runFamilyRelease(ctx, *k, owner.(string))
	}
	kv := k.args()
	args := []any{"evalsha", releaseSHA, "4", kv.lock, kv.released, kv.queue, kv.waiters, owner, l.args.sharded, l.args.remember}
	n, err := evalsha(ctx, l.via(ctx), releaseScript, args).Int64()
	return n == 1, err
}

func (k keys) releaseKeys() []string { return []string{k.lock, k.released, k.queue, k.waiters} }

func (l *Locker) releaseArgs(owner string) []any {
	return []any{owner, l.args.sharded, l.args.remember}
}

// modeArg is mode as a script argument: a constant, so that converting it
// to an interface allocates nothing.
func modeArg(mode string) any {
	if mode == modeWait {
		return modeWait
	}
	return modeTry
}

// runLeave takes owner's entry out of k's queue (see leaveScript).
func (l *Locker) runLeave(ctx context.Context, k keys, owner string) error {
	if k.fam != famMutex {
		return l.runFamilyLeave(ctx, k, owner)
	}
	return leaveScript.Run(ctx, l.via(ctx), []string{k.lock, k.queue, k.waiters},
		owner, l.args.id, l.args.sharded).Err()
}

func (l *Locker) runExtend(ctx context.Context, k keys, owner string, ttl time.Duration) (bool, error) {
	if k.fam != famMutex {
		return l.runFamilyExtend(ctx, k, owner, millis(ttl))
	}
	cmd, acks := l.runScript(ctx, extendScript, []string{k.lock}, owner, millis(ttl))
	n, err := cmd.Int64()
	if err == nil && n == 1 && acks >= 0 && acks < int64(l.cfg.replicas) {
		return false, l.notAcked("the renewal", acks)
	}
	return n == 1, err
}

func (l *Locker) shardedFlag() string {
	if l.sharded {
		return "1"
	}
	return "0"
}
