package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// atRiskThenCleared: a holder cut off from the backend is told its lock
// is at risk (locker.AtRisker) before it is lost, and once healed, before
// its lease ends, that the risk has cleared; the lock is still held. It
// skips on a backend whose Handles are not AtRiskers.
func (s *suite) atRiskThenCleared(t *testing.T, ctx context.Context) {
	s.needCut(t)
	a := s.newLocker(t)
	k := key(t, "")
	h := mustAcquire(t, ctx, a, k, ttl(s))
	defer func() { _ = h.Release(ctx) }()
	r, ok := h.(locker.AtRisker)
	if !ok {
		t.Skipf("conformance: the backend's Handle (%T) is not a locker.AtRisker", h)
	}
	if at, _ := r.AtRisk(); at {
		t.Fatal("AtRisk reports a lock at risk just after its acquisition, with the backend reachable")
	}
	heal := s.cut(t, a)
	cut := time.Now()
	healed := false
	defer func() {
		if !healed {
			heal()
		}
	}()
	waitAtRisk(t, h, r, true, s.h.ExpiryBound, "after its holder was cut off from the backend")
	t.Logf("at risk %v after the cut", time.Since(cut).Round(time.Millisecond))
	heal()
	healed = true
	healedAt := time.Now()
	waitAtRisk(t, h, r, false, s.h.ExpiryBound, "after the cut was healed, before the lease ended")
	t.Logf("cleared %v after the heal", time.Since(healedAt).Round(time.Millisecond))
	if isClosed(h.Done()) {
		t.Fatalf("the lock ended after AtRisk cleared: %v", h.Err())
	}
	mustRelease(t, ctx, h)
}

// waitAtRisk waits until r reports want, failing if h ends first or
// within passes.
func waitAtRisk(t *testing.T, h locker.Handle, r locker.AtRisker, want bool, within time.Duration, when string) {
	t.Helper()
	timeout := time.NewTimer(within)
	defer timeout.Stop()
	for {
		at, changed := r.AtRisk()
		if at == want {
			return
		}
		select {
		case <-changed:
		case <-h.Done():
			if want {
				t.Fatalf("the lock ended (%v) before AtRisk reported it at risk %s", h.Err(), when)
			}
			t.Fatalf("the lock ended (%v) before AtRisk reported it cleared %s", h.Err(), when)
		case <-timeout.C:
			t.Fatalf("AtRisk did not report %t within %v %s", want, within, when)
		}
	}
}
