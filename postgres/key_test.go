package postgres

import (
	"testing"
)

// AdvisoryKey is part of the documented interface (other programs compute
// it): its values must never change.
func TestAdvisoryKeyStable(t *testing.T) {
	for _, c := range []struct {
		ns, key string
		want    int64
	}{
		{"", "a", -618856784144191045},
		{"billing", "invoice/42", 8439653440304532941},
	} {
		if got := AdvisoryKey(c.ns, c.key); got != c.want {
			t.Errorf("AdvisoryKey(%q, %q) = %d, want %d", c.ns, c.key, got, c.want)
		}
	}
	// The namespace is length-prefixed: moving bytes between namespace and
	// key gives another lock.
	if AdvisoryKey("a", "bc") == AdvisoryKey("ab", "c") {
		t.Error(`AdvisoryKey("a", "bc") == AdvisoryKey("ab", "c")`)
	}
}

// keyHalves, which the health check uses to find the lock in pg_locks,
// splits an advisory key as AdvisoryKey documents it: classid holds the high
// 32 bits, objid the low 32, both as non-negative oid values.
func TestKeyHalves(t *testing.T) {
	for _, id := range []int64{0, 1, -1, 0x7FFFFFFF_FFFFFFFF, -0x80000000_00000000, AdvisoryKey("", "a"), AdvisoryKey("billing", "invoice/42")} {
		hi, lo := keyHalves(id)
		if hi < 0 || hi > 0xFFFFFFFF || lo < 0 || lo > 0xFFFFFFFF {
			t.Errorf("keyHalves(%d) = %d, %d: not both in the oid range", id, hi, lo)
		}
		if got := int64(uint64(hi)<<32 | uint64(lo)); got != id {
			t.Errorf("keyHalves(%d) = %d, %d, which put together give %d", id, hi, lo, got)
		}
	}
}
