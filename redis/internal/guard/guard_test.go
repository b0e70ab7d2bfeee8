package guard

import (
	"errors"
	"strings"
	"testing"

	"github.com/go-locker/locker"
)

func TestPolicyError(t *testing.T) {
	for _, p := range []string{"", "noeviction"} {
		if err := PolicyError(p, "node 1"); err != nil {
			t.Errorf("PolicyError(%q): %v, want nil", p, err)
		}
	}
	err := PolicyError("volatile-lru", "node 2 (h:1)")
	if !errors.Is(err, ErrEvictionPolicy) || !errors.Is(err, locker.ErrUnsafeConfig) {
		t.Errorf("PolicyError: %v, want ErrEvictionPolicy and locker.ErrUnsafeConfig", err)
	}
	if !strings.Contains(err.Error(), `"volatile-lru" on node 2 (h:1)`) || !strings.Contains(err.Error(), "noeviction") {
		t.Errorf("PolicyError: %q must name the policy, the server and the remedy", err)
	}
	if ErrEvictionPolicy.Error() != "locker: redis: the server's maxmemory-policy lets it evict locks" {
		t.Errorf("ErrEvictionPolicy says %q", ErrEvictionPolicy)
	}
}
