package backend

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/go-locker/locker"
)

// State is the end-of-life state of one held lock, the part of a Handle that
// every backend shares: Handle.Done and Handle.Err answer from it, and
// whichever of Release, a failed renewal or Close ends the lock first records
// why. The zero value is not usable; call NewState.
type State struct {
	once sync.Once
	done chan struct{}
	mu   sync.Mutex
	err  error
}

// NewState returns the state of a lock that is held.
func NewState() *State { return &State{done: make(chan struct{})} }

// Done is closed once the lock is no longer held.
func (s *State) Done() <-chan struct{} { return s.done }

// Err is nil while held, then the error End was first called with.
func (s *State) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// End records err (locker.ErrReleased, or an error wrapping locker.ErrLost or
// locker.ErrClosed) and closes Done. Only the first call has any effect; it
// reports whether this call was it, so that exactly one of several racing
// endings (two Releases, a Release and a loss) does the work that goes with
// it, such as telling the server.
func (s *State) End(err error) (first bool) {
	s.once.Do(func() {
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		close(s.done)
		first = true
	})
	return first
}

// Ended reports whether End has been called.
func (s *State) Ended() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// ReleaseError is what Release returns on a lock that has ended, or is
// ending: an error with op "release" and key that wraps the error the lock
// ended with (locker.ErrReleased for a second Release, locker.ErrLost after
// a loss, with locker.ErrClosed after Close). The loss's own key and op
// (recorded as op "hold") are dropped, so the message names the key once.
// When End has not been called yet (another Release of the same Handle is
// at work), ReleaseError waits for it as long as ctx allows; if ctx ends
// first, the error wraps ctx's error (see ContextError).
func (s *State) ReleaseError(ctx context.Context, key string) error {
	select {
	case <-s.done:
	default:
		select {
		case <-s.done:
		case <-ctx.Done():
			return KeyError("release", key, fmt.Errorf("%w (another Release of the lock is in progress)", ContextError(ctx)))
		}
	}
	err := s.Err()
	var le *locker.Error
	if errors.As(err, &le) {
		err = le.Err
	}
	return KeyError("release", key, err)
}

// ContextError is the error of a call that ctx ended: ctx.Err(), and
// ctx's cause when it has another (context.WithCancelCause,
// WithDeadlineCause), so that errors.Is finds both.
func ContextError(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, err) {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}
