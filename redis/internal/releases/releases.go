// Package releases holds what the redis and redlock packages share of the
// record a server keeps of a key's recent releases: the name of the record,
// how many releases it holds, and the Lua that writes and reads it.
//
// go-redis sends a request again when the reply to it was lost (a
// connection reset, a read timeout), and so does the redis package itself
// after an inline attempt timed out: a release retried after its first
// attempt deleted the lock finds the lock gone, and without a record of the
// release it would report a lock lost to expiry. The record is a set of
// owner tokens, not one per key: the next holder may take the key and
// release it before the retry comes (its waiters are woken at once), and
// its record must not hide ours.
package releases

import "strconv"

// Suffix ends the name of a key's record, in place of the lock's ":lock",
// so that it carries the lock's hash tag (one Cluster slot for all the
// names of a key). It is not the name of the single-record string of
// earlier versions (":released" in the redis package, ":last-release" in
// redlock), so that a rolling upgrade, old and new Lockers on one key,
// meets no WRONGTYPE: each version reads only the record it writes, and a
// release is retried only by the process that sent it.
const Suffix = ":recent-releases"

// Records is how many recent releases of a key a server remembers: enough
// for as many other holders to come and go before a retried release
// arrives, each of which takes an acquisition and a release of its own.
const Records = 32

// Lua defines two functions for a script that includes it (prepend it):
//
//	remember_release(set, owner, ms)
//	  adds owner to the sorted set under the name set, scored in the order
//	  of the releases, keeps the latest Records, and makes the set expire
//	  ms milliseconds from now (so it lives ms after the key's last release)
//	released_before(set, owner)
//	  tells whether owner is among the releases remembered under set
//
//	remember_release_at(set, owner, ms, t)
//	  the same, for a script that has read the server clock already (t
//	  is TIME's reply): the record is scored by the clock in µs, not by
//	  the last score plus one, which saves the ZRANGE that reads it.
//	  Records of both functions order together: a score the one gives is
//	  above the other's earlier ones (the clock in µs is far above a
//	  count of releases, and a count goes on from the last score). A
//	  script that calls TIME must replicate its effects
//	  (redis.replicate_commands on Redis 5 and 6, before its first write).
//
// remember_release writes; a script that must succeed on a full server
// (maxmemory with noeviction) calls it after a write that frees memory, as
// Redis refuses a write that may grow memory only as a script's first.
// The commands are deterministic, so a script that uses them replicates as
// itself on Redis 5 and 6 without redis.replicate_commands.
var Lua = `
local function remember_release(set, owner, ms)
  local last = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')
  redis.call('ZADD', set, (tonumber(last[2]) or 0) + 1, owner)
  redis.call('ZREMRANGEBYRANK', set, 0, -` + strconv.Itoa(Records+1) + `)
  redis.call('PEXPIRE', set, ms)
end
local function remember_release_at(set, owner, ms, t)
  redis.call('ZADD', set, tonumber(t[1]) * 1000000 + tonumber(t[2]), owner)
  redis.call('ZREMRANGEBYRANK', set, 0, -` + strconv.Itoa(Records+1) + `)
  redis.call('PEXPIRE', set, ms)
end
local function released_before(set, owner)
  return redis.call('ZSCORE', set, owner) ~= false
end
`
