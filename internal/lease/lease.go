// Package lease holds the end-of-life state that every backend's Handle shares:
// a Done channel closed exactly once, and the error that says why.
package lease

import (
	"sync"
)

// State is the life of one held lock. The zero value is not usable; call New.
type State struct {
	once sync.Once
	done chan struct{}
	mu   sync.Mutex
	err  error
}

// New returns the state of a lock that is held.
func New() *State { return &State{done: make(chan struct{})} }

// Done is closed once the lock is no longer held.
func (s *State) Done() <-chan struct{} { return s.done }

// Err is nil while held, then the error End was first called with.
func (s *State) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// End records err (ErrReleased, or an error wrapping ErrLost) and closes Done.
// Only the first call has any effect; it reports whether this call was it.
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
