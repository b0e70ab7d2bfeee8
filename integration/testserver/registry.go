package testserver

import (
	"sync"
	"testing"

	"github.com/go-locker/locker"
)

// Registry remembers what a harness's NewLocker made for each Locker (its
// proxy, its fault injector, ...), so that the harness's Crash, Cut and
// Steal hooks, which are given only the Locker, can find it. The zero
// value is ready to use, and it is safe for concurrent use.
type Registry[T any] struct{ m sync.Map }

// Put records v for l.
func (r *Registry[T]) Put(l locker.Locker, v T) { r.m.Store(l, v) }

// Get returns what was recorded for l, and fails the test (naming hook)
// when nothing was: the Locker was not made by the harness's NewLocker.
func (r *Registry[T]) Get(t testing.TB, l locker.Locker, hook string) T {
	t.Helper()
	v, ok := r.m.Load(l)
	if !ok {
		t.Fatalf("%s: the Locker was not made by NewLocker", hook)
	}
	return v.(T)
}
