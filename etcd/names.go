package etcd

import (
	"strconv"
	"sync"
	"sync/atomic"
)

// Waiter key names are reused. etcd keeps every key that was ever put, with
// its tombstone, in its in-memory index until the revision history is
// compacted (which many clusters never do, or do every few minutes), and
// the owner read of Acquire — the key of smallest create revision under
// the lock directory — walks every key name under the directory, live or
// dead. A fresh name per acquisition made that read cost grow with every
// acquisition of the key since the last compaction (1.1ms to 1.9ms over
// 3000 acquisitions on one member); concurrency.Mutex avoids it by naming
// its key after its lease. A Locker does the same, with a slot number so
// that its concurrent contenders for one key (locks are not reentrant: the
// second waits) get distinct names: <dir><lease id>-<nonce>-<slot>, the
// lowest slot not in use. A slot is free again only once its key is known
// to be gone from the server (released, deleted in cleanup, deleted from
// outside), never on a guess.

// reusedSlots is how many slots per lock directory a lease reuses; a
// Locker with more contenders for one key at once names the rest uniquely
// (slot numbers from reusedSlots up, never reused).
const reusedSlots = 64

// slots hands out the slot numbers of one lease's waiter keys, per lock
// directory.
type slots struct {
	mu   sync.Mutex
	used map[string]uint64 // dir → bit i set: slot i is in use; no zero entries
	next atomic.Uint64     // the unique slots beyond reusedSlots
}

// take returns the lowest free slot of dir.
func (s *slots) take(dir string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.used[dir]
	if u == ^uint64(0) {
		return reusedSlots + s.next.Add(1)
	}
	i := uint64(0)
	for u&(1<<i) != 0 {
		i++
	}
	if s.used == nil {
		s.used = map[string]uint64{}
	}
	s.used[dir] = u | 1<<i
	return i
}

// give makes slot i of dir free again.
func (s *slots) give(dir string, i uint64) {
	if i >= reusedSlots {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if u := s.used[dir] &^ (1 << i); u != 0 {
		s.used[dir] = u
	} else {
		delete(s.used, dir)
	}
}

// waiterName is the etcd key of one contender and the slot it occupies
// until the key is known to be gone.
type waiterName struct {
	ls      *lease
	dir     string
	slot    uint64
	key     string
	freed   atomic.Bool
	dropped atomic.Bool // the lease use given back (see drop)
}

// newName takes a slot of dir on ls and names the waiter key. The name
// holds the use of ls that leaseFor took, until free.
func (l *Locker) newName(ls *lease, dir string) *waiterName {
	n := &waiterName{ls: ls, dir: dir, slot: ls.slots.take(dir)}
	var b []byte
	b = append(b, dir...)
	b = appendHex16(b, uint64(ls.id))
	b = append(b, '-')
	b = append(b, l.nonce...)
	b = append(b, '-')
	b = strconv.AppendUint(b, n.slot, 10)
	n.key = string(b)
	return n
}

// free gives the slot back, once: call it only when the key is gone from
// the server (or was never written).
func (n *waiterName) free() {
	if n.freed.CompareAndSwap(false, true) {
		n.ls.slots.give(n.dir, n.slot)
		n.drop()
	}
}

// drop gives back the name's use of its lease, once, while the name may
// stay reserved: a name whose put may still land (see resolve) need not
// keep its lease, since a retired lease is revoked, and a put naming a
// revoked lease fails.
func (n *waiterName) drop() {
	if n.dropped.CompareAndSwap(false, true) {
		n.ls.unuse()
	}
}

// appendHex16 appends v as 16 lower-case hex digits.
func appendHex16(b []byte, v uint64) []byte {
	const digits = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, digits[(v>>uint(shift))&0xf])
	}
	return b
}
