package backend

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// goid is the calling goroutine's id, from its stack trace's header.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	n, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return n
}

// idleWorkers is how many goroutines of Reuse wait for work.
func (l *Life[H]) idleWorkers() int {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return len(l.workers)
}

// awaitIdle waits until n goroutines of Reuse wait for work.
func awaitIdle[H comparable](t *testing.T, l *Life[H], n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for l.idleWorkers() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle workers after 10s, want %d", l.idleWorkers(), n)
		}
		runtime.Gosched() // a worker parks itself after its function returns: nothing signals that
	}
}

// Reuse runs one function after another on one goroutine (whose grown
// stack serves them all), starts more for functions that overlap, keeps at
// most maxIdleWorkers waiting, and Close ends those that wait.
func TestReuse(t *testing.T) {
	l := NewLife[int](nil)
	ran := make(chan uint64, 1)
	run := func() { ran <- goid() }
	if !l.Reuse(run) {
		t.Fatal("Reuse refused before Close")
	}
	first := <-ran
	awaitIdle(t, l, 1)
	for i := range 3 {
		if !l.Reuse(run) {
			t.Fatal("Reuse refused before Close")
		}
		if id := <-ran; id != first {
			t.Fatalf("call %d ran on goroutine %d, the first on %d: the idle worker was not reused", i+2, id, first)
		}
		awaitIdle(t, l, 1)
	}

	// Overlapping functions: one goroutine each; all but maxIdleWorkers end.
	n := maxIdleWorkers + 4
	var started, release sync.WaitGroup
	started.Add(n)
	release.Add(1)
	ids := make(chan uint64, n)
	for range n {
		if !l.Reuse(func() {
			ids <- goid()
			started.Done()
			release.Wait()
		}) {
			t.Fatal("Reuse refused before Close")
		}
	}
	started.Wait()
	seen := map[uint64]bool{}
	for range n {
		seen[<-ids] = true
	}
	if len(seen) != n {
		t.Fatalf("%d overlapping functions ran on %d goroutines", n, len(seen))
	}
	release.Done()
	awaitIdle(t, l, maxIdleWorkers)

	start := time.Now()
	if err := l.Close(Closer[int]{Grace: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Close took %v: it waited for its grace, so the idle workers did not end when it began", took)
	}
	if l.idleWorkers() != 0 {
		t.Fatalf("%d idle workers after Close", l.idleWorkers())
	}
	if l.Reuse(run) {
		t.Fatal("Reuse ran a function after Close had stopped waiting")
	}
}
