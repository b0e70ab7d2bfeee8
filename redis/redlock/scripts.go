package redlock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/redis/internal/guard"
)

// The scripts run atomically on one node each; no script touches two
// nodes. The lock key holds the holder's owner token (random, fresh for
// every acquisition round, without ':'; see withDescription for the
// holder's description it may carry), followed by ':' and a token (for
// Inspect): the node's counter at the grant (a mutex's or a writer's lock
// key), replaced by the fencing token where a write-back or a claim runs;
// it expires with the lease. The fence key is the node's own counter for
// the key, which never expires and only grows (INCR on a grant, max on a
// write-back).

// scriptIndex numbers the scripts the Locker runs on the nodes (newScript),
// for scriptState.
var scriptIndex = map[*goredis.Script]int{}

// newScript is goredis.NewScript for a script of the nodes.
func newScript(src string) *goredis.Script {
	s := goredis.NewScript(src)
	scriptIndex[s] = len(scriptIndex)
	return s
}

// A script runs by its hash (EVALSHA) on a node known to have it cached,
// else by its text (EVAL), which caches it there. A node that does not
// have a script answers EVALSHA with NOSCRIPT, and running the script's
// text then (go-redis' Script.Run falls back on EVAL) is a second round
// trip within the request's node timeout: on a link whose round trip is
// more than half the node timeout (a distant node, a tight timeout) such a
// request fails, and the fallback of an acquire round whose pipeline also
// vets the node (a third round trip) never even reached the node, so that
// the script was never cached and the node never granted. So the Locker
// keeps, per node, which scripts it knows the node has (scriptState): a
// script's first use on a node, and its first after a NOSCRIPT (the server
// restarted, flushed its scripts, or evicted ours: recent servers evict
// scripts EVAL cached, least recently used first), which forgets them all,
// runs by its text in one round trip. (Loading every script at first
// contact, SCRIPT LOAD, was tried: a burst of first calls then made the
// server compile every script at once, and a node answered late.)

// scriptState is what the Locker knows of one node's script cache.
type scriptState struct {
	has atomic.Uint64 // bit i: the script numbered i (scriptIndex) is cached there
}

type scriptsKey struct{}

// withScripts is ctx carrying the script state of the node a request goes
// to (see runScript).
func withScripts(ctx context.Context, st *scriptState) context.Context {
	return context.WithValue(ctx, scriptsKey{}, st)
}

// scriptsOf is the script state ctx carries; a request without one knows
// nothing of its node's scripts (a fresh state, not kept).
func scriptsOf(ctx context.Context) *scriptState {
	if st, ok := ctx.Value(scriptsKey{}).(*scriptState); ok {
		return st
	}
	return &scriptState{}
}

func (st *scriptState) cached(s *goredis.Script) bool {
	return st.has.Load()&(1<<scriptIndex[s]) != 0
}

// lost forgets what the node had: it answered NOSCRIPT.
func (st *scriptState) lost() { st.has.Store(0) }

// ran records what an EVAL of s did: a script that ran, or failed as it
// ran, was compiled and cached; a request that failed on its way was not,
// or is not known to be.
func (st *scriptState) ran(s *goredis.Script, eval *goredis.Cmd) {
	if err := eval.Err(); err == nil || errors.Is(err, goredis.Nil) || goredis.HasErrorPrefix(err, "ERR") {
		st.has.Or(1 << scriptIndex[s])
	}
}

// runScript runs s on c (see above for how); ctx carries the node's script
// state (withScripts).
func runScript(ctx context.Context, c goredis.UniversalClient, s *goredis.Script, keys []string, args ...any) *goredis.Cmd {
	st := scriptsOf(ctx)
	if st.cached(s) {
		cmd := s.EvalSha(ctx, c, keys, args...)
		if !goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			return cmd
		}
		st.lost()
	}
	cmd := s.Eval(ctx, c, keys, args...)
	st.ran(s, cmd)
	return cmd
}

// luaOurs tells whether a lock value v belongs to owner o.
var luaOurs = `
local function ours(v, o)
  return ` + oursExpr("v", "o") + `
end
`

// oursExpr is the Lua expression that tells whether the lock value v
// belongs to owner o (each a Lua expression evaluated more than once: a
// name): the owner token alone, or followed by ':' and the token. For a
// script that checks before luaOurs is defined (a fast path).
func oursExpr(v, o string) string {
	return v + " == " + o + " or (type(" + v + ") == 'string' and string.sub(" + v + ", 1, #" + o + " + 1) == " + o + " .. ':')"
}

// The mutex's grant, on one node, is famAcquireScript's for kind "w" on the
// mutex's names (its lock key as the writer's): the lock is granted if it
// is free and no waiter is queued before the caller, and only then is the
// node's counter advanced (INCR before SET, so that a failing INCR, on a
// foreign value under our prefix, leaves no lock behind: Redis does not
// roll a script back). A refusal names the holder's owner token, which
// tells a holder of a majority from contenders that split the nodes.
//
// A lock that already carries our owner token is a retry by go-redis of a
// request whose reply was lost: the lock is ours, and the counter is at
// least what our grant made it (nothing else granted since), which is all
// the fencing argument needs of the value (see doc.go).
//
// An owner token among the recent releases (see the mutex's release below)
// is a request that arrived after the round it belongs to gave up and
// deleted its lock here, or after its lock was released: a request that
// waited on another connection, or in the network, and that a clean-up
// sent later overtook. It is refused ({0, -1, the owner token}), so that it
// cannot leave a lock that nobody holds, and that nobody deletes, until its
// lease ends.

// writebackScript raises the node's counter to the candidate token, but
// only while our lock is still on the node: that is what makes the
// write-back count towards the majority the fencing argument needs.
//
//	KEYS[1] lock, KEYS[2] fence
//	ARGV[1] owner token, ARGV[2] candidate token (decimal)
//	returns 1 when our lock was there (and the counter is now at least the
//	candidate), 0 when it was not (nothing changed)
//
// It also records the token in the lock's value, keeping its expiry, so
// that Inspect can report it.
var writebackScript = newScript(luaOurs + `
if not ours(redis.call('GET', KEYS[1]), ARGV[1]) then
  return 0
end
local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
if cur == nil then
  return redis.error_reply('fence counter ' .. KEYS[2] .. ' does not hold a number')
end
if cur < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl > 0 then
  redis.call('SET', KEYS[1], ARGV[1] .. ':' .. ARGV[2], 'PX', pttl)
end
return 1
`)

// extendScript resets the lease on one node only if the lock there still
// carries our owner token.
//
//	KEYS[1] lock; ARGV[1] owner token, ARGV[2] lease in milliseconds
//	returns 1 when extended, 0 when the lock was not ours
var extendScript = newScript(luaOurs + `
if not ours(redis.call('GET', KEYS[1]), ARGV[1]) then
  return 0
end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
`)

// extendManyScript is extendScript for many locks in one call: the
// renewals of a Locker's locks of one TTL that come due together
// (renewMany). Entry i is KEYS[i] and ARGV[3i-2..3i]: its kind ("m": a
// lock key holding its owner token, the mutex's, a writer's or a permit's
// slot; "r": a reader, KEYS[i] the readers' sorted set of its key, as
// famExtendScript renews it), its owner token, and its lease in
// milliseconds. It returns, per entry, 1 when extended and 0 when the
// lock was no longer ours.
var extendManyScript = newScript(luaOurs + `
if redis.replicate_commands then redis.replicate_commands() end
local now
local function lock(k, owner, ttl)
  if ours(redis.call('GET', k), owner) then
    return redis.call('PEXPIRE', k, ttl)
  end
  return 0
end
local function reader(k, owner, ttl)
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local s = redis.call('ZSCORE', k, owner)
  if not s or tonumber(s) <= now then return 0 end
  redis.call('ZADD', k, 'XX', now + ttl, owner)
  local p = redis.call('PTTL', k)
  if p == -1 or (p >= 0 and p < ttl) then
    redis.call('PEXPIRE', k, math.max(ttl, 1))
  end
  return 1
end
local r = {}
for i, k in ipairs(KEYS) do
  local f = lock
  if ARGV[3*i-2] == 'r' then f = reader end
  -- A key of another type (written over from outside) fails its own
  -- entry, not the batch: the lock is not ours there.
  local ok, v = pcall(f, k, ARGV[3*i-1], tonumber(ARGV[3*i]))
  if ok then r[i] = v else r[i] = 0 end
end
return r
`)

// The mutex's release, on one node, is famReleaseScript's for kind "w": it
// deletes the lock only if it carries our owner token, and then, if asked,
// wakes the waiter at the head of the node's queue (PUBLISH "q <id>" on the
// key's channel: only that waiter runs a round, not every waiter of the
// key).
//
// The release is remembered (a record of its own, named by the key's
// record prefix and our owner token, which expires releaseMemory after the
// release; see package releases), as the redis
// package's release is, because go-redis retries a request whose reply was
// lost (a connection reset): the retry finds the lock gone, and without
// the record a Release that worked on a majority would report a lost lock.
// A record per release, not one per key: the next holder may take the key and
// release it before the retry comes (its waiters are woken at once), and
// its record must not hide ours. The clean-up of a failed round records
// its owner token too, whether or not its lock was there: an acquire
// request of that round that comes later is refused (see the mutex's grant
// above).
//
// The record is written after the DEL: on a full server (maxmemory with
// noeviction) Redis refuses a write that may grow memory only as a
// script's first write, so the release still happens, record and all (see
// the redis package's release script); a clean-up that finds nothing to
// delete on a full server fails, as nothing grants there either.

// releaseMemory is how long the release script remembers a release, so that
// a retry of it by go-redis is recognised (see the mutex's release). go-redis
// retries at most MaxRetries times (3 by default) within the request's
// context (the node timeout, at most MaxNodeTimeout) or, without
// ContextTimeoutEnabled, its ReadTimeout (3s) each, with a backoff of at
// most 512ms.
const releaseMemory = 15 * time.Second

// millis renders a lease for PX/PEXPIRE, rounded up: a node may keep the
// lock a little longer than the holder believes, never shorter.
func millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// grant is one node's answer to an acquire request.
type grant struct {
	ok     bool
	token  int64          // when ok: the node's counter after the grant
	pttl   time.Duration  // when !ok: the holder's remaining lease there; <0 unknown
	holder string         // when !ok: the holder's owner token
	vet    *guard.Vetting // the node's policy and identity, when the round asked (see vet.go)

	// The lock families only (famAcquireScript).
	slot     int   // when ok: the permit slot granted
	free     []int // a semaphore's free slots on the node
	mismatch int   // > 0: the node's holders and waiters have this limit instead
	ticket   int64 // when !ok: the waiter's provisional ticket on the node (first rounds)
}

func runAcquire(ctx context.Context, c goredis.UniversalClient, k keys, owner string, ttl time.Duration, q *queued, prefer int) (grant, error) {
	v, err := runScript(ctx, c, famAcquireScript, k.famKeys(), famArgsAcquire(k, owner, ttl, q, prefer)...).Slice()
	return famAcquireReply(k, v, err)
}

// acquireReply reads the acquire script's reply.
func acquireReply(k keys, v []any, err error) (grant, error) {
	if err != nil {
		return grant{}, err
	}
	if len(v) < 2 {
		return grant{}, fmt.Errorf("acquire script returned %d values, want 2 or 3", len(v))
	}
	flag, _ := v[0].(int64)
	n, ok := v[1].(int64)
	if !ok {
		return grant{}, fmt.Errorf("acquire script returned %T, want an integer", v[1])
	}
	if flag == 1 {
		if n <= 0 {
			return grant{}, fmt.Errorf("fence counter %s returned %d; it must be positive (was it overwritten?)", k.fence, n)
		}
		return grant{ok: true, token: n}, nil
	}
	g := grant{pttl: -1}
	if n >= 0 {
		g.pttl = time.Duration(n) * time.Millisecond
	}
	if len(v) > 2 {
		g.holder, _, _ = strings.Cut(fmt.Sprint(v[2]), ":")
	}
	return g, nil
}

func runWriteback(ctx context.Context, c goredis.UniversalClient, k keys, owner string, token int64) (bool, error) {
	n, err := runScript(ctx, c, writebackScript, []string{k.lock, k.fence}, owner, strconv.FormatInt(token, 10)).Int64()
	return n == 1, err
}

func runExtend(ctx context.Context, c goredis.UniversalClient, k keys, owner string, ttl time.Duration) (bool, error) {
	if k.kind == readLock {
		n, err := runScript(ctx, c, famExtendScript, []string{k.base}, owner, millis(ttl)).Int64()
		return n == 1, err
	}
	n, err := runScript(ctx, c, extendScript, []string{k.lock}, owner, millis(ttl)).Int64()
	return n == 1, err
}

// runRelease deletes our lock on one node, remembers the release, and
// wakes the node's waiters.
func runRelease(ctx context.Context, c goredis.UniversalClient, k keys, owner string) (bool, error) {
	return runFamRelease(ctx, c, k, owner, true, nil, "")
}

// runDelete deletes our lock on one node without waking anyone, and keeps
// a later acquire request of the same round from granting it again: for
// the partial grants of a round that failed.
func runDelete(ctx context.Context, c goredis.UniversalClient, k keys, owner string) (bool, error) {
	return runFamRelease(ctx, c, k, owner, false, nil, "")
}

// inspectScript reads the lock on one node: {value or false, PTTL}.
var inspectScript = newScript(`
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
`)

// withDescription is the owner token of a lock whose holder described
// itself with locker.WithOwner: the random owner token (base64url), a
// space and the description query-escaped, so that the whole stays without
// ':' (see luaOurs) and without a second space; or the random owner token
// alone. Release, renewal and the write-back compare the whole, so the
// description costs no command of its own.
func withDescription(owner, desc string) string {
	if desc == "" {
		return owner
	}
	return owner + " " + url.QueryEscape(desc)
}

// description is the holder's description in an owner token (see
// withDescription), or "".
func description(owner string) string {
	_, esc, ok := strings.Cut(owner, " ")
	if !ok {
		return ""
	}
	desc, err := url.QueryUnescape(esc)
	if err != nil {
		return ""
	}
	return desc
}

// lockState is one node's view of a lock.
type lockState struct {
	owner string        // "" when free
	token int64         // 0 when not recorded (yet)
	pttl  time.Duration // <0 unknown
}

func runInspect(ctx context.Context, c goredis.UniversalClient, k keys) (lockState, error) {
	v, err := runScript(ctx, c, inspectScript, []string{k.lock}).Slice()
	if err != nil && err != goredis.Nil {
		return lockState{}, err
	}
	st := lockState{pttl: -1}
	if len(v) < 2 {
		return st, nil
	}
	if s, ok := v[0].(string); ok {
		owner, tok, _ := strings.Cut(s, ":")
		st.owner = owner
		st.token, _ = strconv.ParseInt(tok, 10, 64)
	}
	if n, ok := v[1].(int64); ok && n >= 0 {
		st.pttl = time.Duration(n) * time.Millisecond
	}
	return st, nil
}
