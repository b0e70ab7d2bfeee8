package lease

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// riskHandle is a lease Handle whose renewals do what mode says: 0
// succeed, 1 fail at once, 2 hang until their ctx ends.
func riskHandle(t *testing.T, mode *atomic.Int32) *Handle {
	t.Helper()
	h := &Handle{}
	f := &fake{ours: true, admitted: true, renew: func(ctx context.Context) (bool, error) {
		switch mode.Load() {
		case 1:
			return false, errors.New("connection refused")
		case 2:
			<-ctx.Done()
			return false, ctx.Err()
		}
		return true, nil
	}}
	h.Init("k", "owner", 1, time.Second, backend.NewState(), f.proto())
	h.Start(time.Now(), true, RenewConfig{Drift: 50 * time.Millisecond, Interval: 100 * time.Millisecond, Retry: 50 * time.Millisecond})
	t.Cleanup(func() { _ = h.Release(context.Background()) })
	return h
}

// waitRisk waits for h's AtRisk to report want, failing if the lock
// ends first.
func waitRisk(t *testing.T, h *Handle, want bool) {
	t.Helper()
	for {
		at, changed := h.AtRisk()
		if at == want {
			return
		}
		select {
		case <-changed:
		case <-h.State.Done():
			t.Fatalf("lock ended (%v) before AtRisk reported %t", h.State.Err(), want)
		}
	}
}

// TestAtRiskOnFailedRenewal: a renewal that fails puts the lock at risk
// before it is lost, and one that succeeds again clears it.
func TestAtRiskOnFailedRenewal(t *testing.T) {
	var mode atomic.Int32
	h := riskHandle(t, &mode)
	if at, _ := h.AtRisk(); at {
		t.Fatal("at risk when acquired")
	}
	mode.Store(1)
	waitRisk(t, h, true)
	mode.Store(0)
	waitRisk(t, h, false)
	if h.State.Err() != nil {
		t.Fatalf("lock ended: %v", h.State.Err())
	}
}

// TestAtRiskOnHangingRenewal: a renewal that hangs (a partition: the
// request fails only at the deadline) puts the lock at risk Retry after
// it was sent, before the loss.
func TestAtRiskOnHangingRenewal(t *testing.T) {
	var mode atomic.Int32
	h := riskHandle(t, &mode)
	mode.Store(2)
	waitRisk(t, h, true)
	// Well before the loss, not as the hung request ends at the deadline.
	if left := time.Until(h.Lease().Deadline()); left < 300*time.Millisecond {
		t.Errorf("at risk only %v before the lease's deadline; want it Retry (50ms) after the hung renewal was sent", left)
	}
	<-h.State.Done()
	if err := h.State.Err(); !errors.Is(err, locker.ErrLost) {
		t.Fatalf("Err %v, want ErrLost", err)
	}
}
