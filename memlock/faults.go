package memlock

import (
	"sync"

	"github.com/go-locker/locker/backend"
)

// The fault hooks that memlock's tests (and the conformance suite, through
// the harness in conformance_test.go) use to crash a client or cut it off
// from its Store. They are not part of the backend proper.

// crash is the fault hook for tests: l dies as a process killed with SIGKILL
// would. It stops renewing and forgets its handles without releasing them or
// ending them, so its locks stay in the store until their leases expire (the
// store then ends the handles with ErrLost). Its blocked Acquires end with
// ErrClosed, and every later call fails with ErrClosed.
func (l *Locker) crash() {
	l.mu.Lock()
	l.crashed = true
	l.mu.Unlock()
	_ = l.life.Close(backend.Closer[*handle]{Release: func(held []*handle) error {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, h := range held {
			l.forgetLocked(h) // neither released nor ended: the store expires them
		}
		return nil
	}})
}

// cut is the fault hook for tests: l keeps running but can no longer reach
// its store, as in a network partition. Until heal is called, its renewals
// fail (so its locks are lost when their leases expire, and the store then
// ends its handles with ErrLost), its blocked Acquires end with an error,
// and its calls fail at once. heal may be called more than once.
func (l *Locker) cut() (heal func()) {
	l.mu.Lock()
	l.isCut = true
	l.endWaitersLocked(errUnreachable)
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			l.isCut = false
			l.mu.Unlock()
		})
	}
}
