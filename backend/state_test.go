package backend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

func TestEndOnce(t *testing.T) {
	s := NewState()
	if s.Ended() || s.Err() != nil {
		t.Fatal("a new State is ended")
	}
	first, second := errors.New("first"), errors.New("second")
	var (
		wg    sync.WaitGroup
		wins  atomic.Int32
		start = make(chan struct{})
	)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			err := first
			if i%2 == 1 {
				err = second
			}
			if s.End(err) {
				wins.Add(1)
			}
			<-s.Done() // closed by whichever End came first
			if s.Err() == nil {
				t.Error("Err() is nil after Done() closed")
			}
		}()
	}
	close(start)
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d End calls reported being first, want 1", wins.Load())
	}
	got := s.Err()
	if !s.Ended() || (got != first && got != second) {
		t.Fatalf("Ended()=%v Err()=%v", s.Ended(), got)
	}
	if s.End(errors.New("late")) || s.Err() != got {
		t.Fatal("a late End changed the state")
	}
}

func TestReleaseError(t *testing.T) {
	s := NewState()
	// Not ended, and ctx ends first: another Release is at work.
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("shutting down")
	cancel(cause)
	err := s.ReleaseError(ctx, "k")
	if !errors.Is(err, context.Canceled) || !errors.Is(err, cause) || !strings.Contains(err.Error(), "another Release") {
		t.Errorf("ReleaseError before End with ctx ended = %v", err)
	}
	// Ended by a loss recorded as op "hold": the release error wraps the
	// loss, names the key once and the op "release".
	s.End(KeyError("hold", "k", fmt.Errorf("%w: lease ran out", locker.ErrLost)))
	err = s.ReleaseError(context.Background(), "k")
	var le *locker.Error
	if !errors.Is(err, locker.ErrLost) || !errors.As(err, &le) || le.Op != "release" || strings.Count(err.Error(), `"k"`) > 1 {
		t.Errorf("ReleaseError after a loss = %v", err)
	}
	// A second Release of a released lock.
	r := NewState()
	r.End(locker.ErrReleased)
	if err := r.ReleaseError(context.Background(), "k"); !errors.Is(err, locker.ErrReleased) {
		t.Errorf("ReleaseError after Release = %v", err)
	}
}

func TestContextError(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ContextError(ctx); err != context.Canceled {
		t.Errorf("ContextError without a cause = %v", err)
	}
	cause := errors.New("deadline of the job")
	dctx, dcancel := context.WithDeadlineCause(context.Background(), time.Now(), cause)
	defer dcancel()
	<-dctx.Done()
	if err := ContextError(dctx); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, cause) {
		t.Errorf("ContextError with a cause = %v", err)
	}
}
