package etcd

import (
	"github.com/go-locker/locker/backend"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

func TestSlotsReuseLowestFree(t *testing.T) {
	var s slots
	if got := s.take("d/"); got != 0 {
		t.Fatalf("first slot = %d, want 0", got)
	}
	if got := s.take("d/"); got != 1 {
		t.Fatalf("second slot = %d, want 1", got)
	}
	if got := s.take("e/"); got != 0 {
		t.Fatalf("another directory's first slot = %d, want 0", got)
	}
	s.give("d/", 0)
	if got := s.take("d/"); got != 0 {
		t.Fatalf("slot after giving 0 back = %d, want 0", got)
	}
	s.give("d/", 0)
	s.give("d/", 1)
	s.give("e/", 0)
	if len(s.used) != 0 {
		t.Fatalf("directories with no slot in use are kept: %v", s.used)
	}
}

func TestSlotsBeyondReusedAreUnique(t *testing.T) {
	var s slots
	for i := range uint64(reusedSlots) {
		if got := s.take("d/"); got != i {
			t.Fatalf("slot %d = %d", i, got)
		}
	}
	a, b := s.take("d/"), s.take("d/")
	if a < reusedSlots || b < reusedSlots || a == b {
		t.Fatalf("slots beyond the reused ones = %d, %d: want distinct, ≥ %d", a, b, reusedSlots)
	}
	s.give("d/", a) // not reused: no effect
	s.give("d/", 5)
	if got := s.take("d/"); got != 5 {
		t.Fatalf("slot after giving 5 back = %d, want 5", got)
	}
}

func TestWaiterNameFreesOnce(t *testing.T) {
	l := &Locker{nonce: "n", cfg: config{Settings: backend.Settings{TTL: locker.DefaultTTL}}, leases: map[time.Duration]*lease{}}
	ls := &lease{l: l, id: 0x2a, ttl: locker.DefaultTTL, users: 3} // leaseFor's use per name
	l.leases[ls.ttl] = ls
	a := l.newName(ls, "/locker/k/")
	if want := "/locker/k/000000000000002a-n-0"; a.key != want {
		t.Fatalf("name = %q, want %q", a.key, want)
	}
	a.free()
	b := l.newName(ls, "/locker/k/") // reuses slot 0
	a.free()                         // a second free must not give b's slot away
	c := l.newName(ls, "/locker/k/")
	if b.key == c.key {
		t.Fatalf("two live contenders share the name %q", b.key)
	}
	if ls.users != 2 {
		t.Fatalf("lease uses after one name freed twice = %d, want 2", ls.users)
	}
	b.free()
	c.free()
	if ls.users != 0 || ls.idle != nil {
		t.Fatalf("default lease: uses %d, idle timer set %t; want 0 and no timer (the default lease is kept)", ls.users, ls.idle != nil)
	}
}
