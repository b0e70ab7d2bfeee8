package etcd

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

func TestRetryable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{rpctypes.ErrNoLeader, true},
		{rpctypes.ErrTimeout, true},
		{rpctypes.ErrLeaderChanged, true},
		{rpctypes.ErrTooManyRequests, true},
		{context.DeadlineExceeded, true},
		{fmt.Errorf("wrapped: %w", rpctypes.ErrTimeoutDueToConnectionLost), true},
		{rpctypes.ErrPermissionDenied, false},
		{rpctypes.ErrLeaseNotFound, false},
		{rpctypes.ErrAuthFailed, false},
		{context.Canceled, false},
		{nil, false},
	} {
		if got := retryable(tc.err); got != tc.want {
			t.Errorf("retryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestAttemptWait(t *testing.T) {
	for ttl, want := range map[time.Duration]time.Duration{
		time.Second:      time.Second,
		2 * time.Second:  time.Second,
		6 * time.Second:  2 * time.Second,
		10 * time.Second: 10 * time.Second / 3,
		time.Minute:      5 * time.Second,
	} {
		if got := attemptWait(ttl); got != want {
			t.Errorf("attemptWait(%v) = %v, want %v", ttl, got, want)
		}
	}
	if !errors.Is(fmt.Errorf("%w: x", errUnknownOutcome), errUnknownOutcome) {
		t.Error("errUnknownOutcome does not wrap")
	}
}
