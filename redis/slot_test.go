package redis

import "testing"

// The values are those of CLUSTER KEYSLOT on Redis 7.0 (redis-server of
// Debian 12), and the CRC16 check
// value of the Cluster specification (CRC16("123456789") = 0x31C3).
func TestClusterSlot(t *testing.T) {
	for _, c := range []struct {
		key  string
		slot int
	}{
		{"123456789", 0x31C3},
		{"foo", 12182},
		{"bar", 5061},
		{"somekey", 11058},
		{"", 0},
		{"{user1000}.following", 3443},
		{"{user1000}.followers", 3443},
		{"user1000", 3443},
		{"foo{}{bar}", 8363},    // empty tag: the whole key
		{"foo{{bar}}zap", 4015}, // the tag is "{bar"
		{"foo{bar}{zap}", 5061},
	} {
		if got := clusterSlot(c.key); got != c.slot {
			t.Errorf("clusterSlot(%q) = %d, want %d", c.key, got, c.slot)
		}
	}
}
