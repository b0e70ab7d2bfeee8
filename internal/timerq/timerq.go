// Package timerq runs callbacks a fixed delay after they were added, all of
// them on one runtime timer per queue.
//
// A backend that arms a timer per acquisition (a monitor that starts a
// little after the grant, a backstop that closes a socket if a statement
// hangs) and stops it again a few hundred microseconds later pays for it
// on every acquisition: creating a timer that becomes the earliest one of
// its P wakes the network poller, a futex wake-up of another thread. With
// one delay for every entry, due times come in the order the entries were
// added, so a queue is a FIFO list: adding and stopping are O(1) under a
// mutex, and the runtime timer is re-armed only when the head changes.
package timerq

import (
	"sync"
	"time"
)

// Queue runs each added callback once its delay has passed, unless it was
// stopped. The zero value is not usable; use New.
type Queue struct {
	d time.Duration

	mu         sync.Mutex
	head, tail *Entry
	timer      *time.Timer // armed for head.due while the list is not empty
	armedFor   time.Time   // the due time the timer is armed for; zero when idle
}

// Entry is one callback in a Queue.
type Entry struct {
	q          *Queue
	due        time.Time
	f          func()
	prev, next *Entry
	queued     bool // in the list; guarded by q.mu
}

// New returns a queue whose callbacks run d after they were added.
func New(d time.Duration) *Queue {
	return &Queue{d: d}
}

// Add schedules f to run, on a goroutine of the queue's timer, once the
// queue's delay has passed. f runs with no lock held and must not block for
// long: it delays the callbacks due after it (start a goroutine for slow
// work).
func (q *Queue) Add(f func()) *Entry {
	e := &Entry{q: q, due: time.Now().Add(q.d), f: f, queued: true}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.tail == nil {
		q.head, q.tail = e, e
	} else {
		e.prev = q.tail
		q.tail.next = e
		q.tail = e
	}
	if q.armedFor.IsZero() {
		q.arm(e.due)
	}
	return e
}

// arm sets the timer for due. q.mu is held.
func (q *Queue) arm(due time.Time) {
	q.armedFor = due
	if q.timer == nil {
		q.timer = time.AfterFunc(time.Until(due), q.fire)
		return
	}
	q.timer.Reset(time.Until(due))
}

// Stop removes the entry. It reports whether that kept its callback from
// running: false if the callback has run, is running, or Stop was called
// before.
func (e *Entry) Stop() bool {
	q := e.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if !e.queued {
		return false
	}
	q.unlink(e)
	return true
}

// unlink takes e out of the list. q.mu is held. The timer stays armed for
// the old head, if e was it: firing early is harmless (fire re-arms), and
// stopping it would cost as much as the firing.
func (q *Queue) unlink(e *Entry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		q.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		q.tail = e.prev
	}
	e.prev, e.next, e.queued = nil, nil, false
}

// fire runs the callbacks that are due and re-arms the timer for the next.
func (q *Queue) fire() {
	for {
		q.mu.Lock()
		e := q.head
		if e == nil {
			q.armedFor = time.Time{}
			q.mu.Unlock()
			return
		}
		if rem := time.Until(e.due); rem > 0 {
			q.arm(e.due)
			q.mu.Unlock()
			return
		}
		q.unlink(e)
		q.mu.Unlock()
		e.f()
	}
}
