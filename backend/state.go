package backend

import (
	"sync"
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
