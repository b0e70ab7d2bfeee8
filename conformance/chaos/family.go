package chaos

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/go-locker/locker"
)

// Family is the lock family a run exercises: the mutex (the zero value),
// a semaphore of n permits, or reader-writer locks. Set it in
// Harness.Family; the faults and the checks are the run's either way.
type Family struct {
	kind familyKind
	n    int // a semaphore's limit
}

type familyKind uint8

const (
	mutexFamily familyKind = iota
	semaphoreFamily
	rwFamily
)

// maxSemaphore is the largest limit of a semaphore run (the register's
// model keeps its writers in an array of this size).
const maxSemaphore = 16

// Semaphore is the family of a run whose workers take permits of a
// semaphore of n (locker.Semaphore) on each key, 1 ≤ n ≤ 16.
func Semaphore(n int) Family { return Family{kind: semaphoreFamily, n: n} }

// ReadWrite is the family of a run whose workers take reader-writer locks
// (locker.ReadLock, locker.WriteLock): one hold in four is a writer's.
func ReadWrite() Family { return Family{kind: rwFamily} }

// String names the family, as the report does: "mutex", "semaphore(n)",
// "read-write".
func (f Family) String() string {
	switch f.kind {
	case semaphoreFamily:
		return fmt.Sprintf("semaphore(%d)", f.n)
	case rwFamily:
		return "read-write"
	}
	return "mutex"
}

// parseFamily reads what String wrote (a worker process gets its family
// from its environment).
func parseFamily(s string) (Family, error) {
	switch {
	case s == "" || s == "mutex":
		return Family{}, nil
	case s == "read-write":
		return ReadWrite(), nil
	}
	if v, ok := strings.CutPrefix(s, "semaphore("); ok {
		if v, ok := strings.CutSuffix(v, ")"); ok {
			if n, err := strconv.Atoi(v); err == nil {
				f := Semaphore(n)
				return f, f.validate()
			}
		}
	}
	return Family{}, fmt.Errorf("chaos: %q names no lock family", s)
}

func (f Family) validate() error {
	if f.kind == semaphoreFamily && (f.n < 1 || f.n > maxSemaphore) {
		return fmt.Errorf("chaos: a semaphore run's limit must be 1 to %d, got %d", maxSemaphore, f.n)
	}
	return nil
}

// limit is how many holders of a key may hold it at once (for the
// reader-writer family: one writer, or any number of readers).
func (f Family) limit() int {
	if f.kind == semaphoreFamily {
		return f.n
	}
	return 1
}

// Hold modes, as recorded on acquire events and in Hold.Mode.
const (
	modeRead   = "read"
	modeWrite  = "write"
	modePermit = "permit"
)

// views are the Lockers a worker acquires through: the family's views of
// the backend's Locker.
type views struct {
	lock, read, write locker.Locker
	mode              string // of lock
}

// views checks that l has the family and returns its views.
func (f Family) views(l locker.Locker) (views, error) {
	switch f.kind {
	case semaphoreFamily:
		if _, ok := l.(locker.Semaphorer); !ok {
			return views{}, fmt.Errorf("chaos: a %v run needs semaphores, and the backend's Locker (%T) does not implement locker.Semaphorer", f, l)
		}
		return views{lock: locker.Semaphore(l, f.n), mode: modePermit}, nil
	case rwFamily:
		if _, ok := l.(locker.ReadWriter); !ok {
			return views{}, fmt.Errorf("chaos: a %v run needs reader-writer locks, and the backend's Locker (%T) does not implement locker.ReadWriter", f, l)
		}
		return views{read: locker.ReadLock(l), write: locker.WriteLock(l)}, nil
	}
	return views{lock: l}, nil
}
