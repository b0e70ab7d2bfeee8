// Package releases holds what the redis and redlock packages share of the
// record a server keeps of a key's recent releases: the names of the
// records and the Lua that writes and reads them.
//
// go-redis sends a request again when the reply to it was lost (a
// connection reset, a read timeout), and so does the redis package itself
// after an inline attempt timed out: a release retried after its first
// attempt deleted the lock finds the lock gone, and without a record of the
// release it would report a lock lost to expiry. There is a record per
// release, not one per key: the next holder may take the key and release
// it before the retry comes (its waiters are woken at once), and its record
// must not hide ours.
//
// A record is a string of its own, named by the key's record prefix (the
// key's hash tag and Suffix) and the owner token, that expires by itself:
// one SET PX writes it, one EXISTS reads it. Until December 2026 the
// records of a key were one sorted set holding its latest 32 owner tokens,
// which cost a release four commands (TIME, ZADD, ZREMRANGEBYRANK,
// PEXPIRE): measured on Redis 7.0, they were about a third of what the
// Locker's uncontended Acquire+Release cost the server above the least a
// fenced lock costs (issue 32; see BENCHMARKS.md). The price is memory on a
// key released very often: a record takes about 190 bytes on Redis 7.0
// (the key, its value and its expiry), for as long as records are kept,
// where the set of 32 took about 1.3 KB. So a server keeps about 190 bytes
// times the releases of the last releaseMemory (15 s): 28 MB at 10,000
// releases a second.
package releases

// Suffix follows a key's hash tag in the names of its records, each of
// which ends with the owner token of the release it records (so that it
// carries the lock's hash tag: one Cluster slot for all the names of a key).
// A script names the prefix (the tag and Suffix) among its KEYS, for
// routing, and makes a record's name from it. The names are not those of
// earlier versions' records (a sorted set under ":recent-releases", before
// it a string under ":released" in the redis package and ":last-release" in
// redlock), so that a rolling upgrade, old and new Lockers on one key, meets
// no WRONGTYPE: each version reads only the records it writes, and a
// release is retried only by the process that sent it.
const Suffix = ":released-by:"

// Name is the Lua expression of the name of owner's record under the
// record prefix rec (each a Lua expression): for a script that asks one
// EXISTS of a record and other keys together.
func Name(rec, owner string) string {
	return rec + " .. " + owner
}

// Remember is the Lua statement that records owner's release under the
// record prefix rec for ms milliseconds, each argument a Lua expression: for
// a script that writes the record before Lua (the functions) is defined.
func Remember(rec, owner, ms string) string {
	return "redis.call('SET', " + Name(rec, owner) + ", '1', 'PX', " + ms + ")"
}

// Released is the Lua expression that tells whether a release of owner is
// recorded under the record prefix rec (each a Lua expression), for a
// script that reads it before Lua is defined.
func Released(rec, owner string) string {
	return "redis.call('EXISTS', " + Name(rec, owner) + ") == 1"
}

// Lua defines two functions for a script that includes it (prepend it):
//
//	remember_release(rec, owner, ms)
//	  records owner's release under the record prefix rec (a name among
//	  the script's KEYS) for ms milliseconds (see Remember)
//	released_before(rec, owner)
//	  tells whether a release of owner is recorded under rec
//
// remember_release writes; a script that must succeed on a full server
// (maxmemory with noeviction) calls it after a write that frees memory, as
// Redis refuses a write that may grow memory only as a script's first.
// The commands are deterministic, so a script that uses them replicates as
// itself on Redis 5 and 6 without redis.replicate_commands.
var Lua = `
local function remember_release(rec, owner, ms)
  ` + Remember("rec", "owner", "ms") + `
end
local function released_before(rec, owner)
  return ` + Released("rec", "owner") + `
end
`
