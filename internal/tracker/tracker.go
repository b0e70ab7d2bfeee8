// Package tracker counts a Locker's calls and goroutines in progress, so
// that Close can wait for them, boundedly. Unlike sync.WaitGroup it allows
// Add while someone waits, which happens when an active goroutine starts
// another (a waiter's background leave, a Pub/Sub connection's reader)
// during Close.
package tracker

import (
	"sync"
	"time"
)

// Tracker counts what is active. The zero value is ready to use.
type Tracker struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0 while someone waits
}

// Add counts one more active call or goroutine.
func (t *Tracker) Add() {
	t.mu.Lock()
	t.n++
	t.mu.Unlock()
}

// Done ends one that Add counted.
func (t *Tracker) Done() {
	t.mu.Lock()
	t.n--
	if t.n < 0 {
		t.mu.Unlock()
		panic("tracker: Done without Add")
	}
	if t.n == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
	t.mu.Unlock()
}

// Wait waits until nothing is active, or at most d (forever when d < 0),
// and reports whether nothing is active.
func (t *Tracker) Wait(d time.Duration) bool {
	t.mu.Lock()
	if t.n == 0 {
		t.mu.Unlock()
		return true
	}
	if t.idle == nil {
		t.idle = make(chan struct{})
	}
	idle := t.idle
	t.mu.Unlock()
	if d < 0 {
		<-idle
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-idle:
		return true
	case <-timer.C:
		return false
	}
}
