package backend

import (
	"slices"
	"time"
)

// Reusing goroutines. A goroutine's stack starts small and grows by
// copying as a call goes deeper; a client library's request path is deep
// (go-redis' is), so a fresh goroutine per request grows its stack on every
// request: under callgrind, runtime.copystack was a third of the Redis
// Locker's client instructions on its path off the caller's goroutine. A
// worker that runs one request after another keeps its grown stack.

const (
	// maxIdleWorkers bounds the goroutines that Reuse keeps waiting for
	// work: a burst of requests starts as many as it needs, and all but
	// these end when they are done.
	maxIdleWorkers = 8
	// workerIdle is how long a goroutine of Reuse waits for the next
	// function before it ends.
	workerIdle = 30 * time.Second
)

// Reuse is Go on a goroutine that may have run an earlier function of
// Reuse: once f returns, the goroutine waits up to workerIdle for the next
// one (at most maxIdleWorkers wait at a time), until Close begins. Like
// Go, it reports false, running nothing, once Close has stopped waiting.
func (l *Life[H]) Reuse(f func()) bool {
	if !l.IsClosing() {
		l.wmu.Lock()
		if n := len(l.workers); n > 0 {
			w := l.workers[n-1]
			l.workers = l.workers[:n-1]
			l.wmu.Unlock()
			w <- f // the worker receives it, waiting or having timed out (see work)
			return true
		}
		l.wmu.Unlock()
	}
	return l.Go(func() { l.work(f) })
}

// work runs f, then the functions Reuse hands this goroutine, until none
// comes for workerIdle, Close begins, or enough others wait.
func (l *Life[H]) work(f func()) {
	var (
		w     chan func()
		timer *time.Timer
	)
	for {
		f()
		f = nil
		if w == nil {
			w = make(chan func())
			timer = time.NewTimer(workerIdle)
			defer timer.Stop()
		} else {
			timer.Reset(workerIdle)
		}
		l.wmu.Lock()
		if len(l.workers) >= maxIdleWorkers || l.IsClosing() {
			l.wmu.Unlock()
			return
		}
		l.workers = append(l.workers, w)
		l.wmu.Unlock()
		select {
		case f = <-w:
			continue
		case <-timer.C:
		case <-l.closing.Done():
		}
		l.wmu.Lock()
		if i := slices.Index(l.workers, w); i >= 0 {
			l.workers = slices.Delete(l.workers, i, i+1)
			l.wmu.Unlock()
			return
		}
		l.wmu.Unlock()
		// A Reuse took this worker off the list before it could leave:
		// that Reuse is sending its function.
		f = <-w
	}
}
