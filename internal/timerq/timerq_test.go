package timerq

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestRunsAfterDelayInOrder(t *testing.T) {
	const d = 30 * time.Millisecond
	q := New(d)
	var mu sync.Mutex
	var order []int
	done := make(chan struct{})
	start := time.Now()
	var ran [3]time.Time
	for i := range 3 {
		q.Add(func() {
			mu.Lock()
			order = append(order, i)
			ran[i] = time.Now()
			n := len(order)
			mu.Unlock()
			if n == 3 {
				close(done)
			}
		})
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("callbacks did not run")
	}
	mu.Lock()
	defer mu.Unlock()
	for i, v := range order {
		if v != i {
			t.Fatalf("order %v, want 0 1 2", order)
		}
		if at := ran[i].Sub(start); at < d {
			t.Errorf("callback %d ran after %v, before the delay %v", i, at, d)
		}
	}
}

func TestStop(t *testing.T) {
	q := New(20 * time.Millisecond)
	var ran atomic.Int32
	ranCh := make(chan struct{}, 3)
	a := q.Add(func() { ran.Add(1); ranCh <- struct{}{} })
	b := q.Add(func() { t.Error("stopped entry ran") })
	c := q.Add(func() { ran.Add(1); ranCh <- struct{}{} })
	if !b.Stop() {
		t.Fatal("Stop of a queued entry returned false")
	}
	if b.Stop() {
		t.Fatal("second Stop returned true")
	}
	for range 2 {
		select {
		case <-ranCh:
		case <-time.After(5 * time.Second):
			t.Fatal("callbacks did not run")
		}
	}
	if a.Stop() || c.Stop() {
		t.Error("Stop after the callback ran returned true")
	}
	// Stopping the head (the entry the timer is armed for) must not lose
	// the entries behind it.
	d := q.Add(func() { t.Error("stopped head ran") })
	e := q.Add(func() { ranCh <- struct{}{} })
	d.Stop()
	select {
	case <-ranCh:
	case <-time.After(5 * time.Second):
		t.Fatal("entry behind a stopped head did not run")
	}
	_ = e
}

func TestQueueRestartsAfterIdle(t *testing.T) {
	q := New(5 * time.Millisecond)
	for round := range 3 {
		ch := make(chan struct{})
		q.Add(func() { close(ch) })
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: callback did not run after the queue went idle", round)
		}
	}
}

func TestConcurrentAddStop(t *testing.T) {
	q := New(2 * time.Millisecond)
	var ran, stopped atomic.Int64
	var wg sync.WaitGroup
	const n = 2000
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				e := q.Add(func() { ran.Add(1) })
				if (i+g)%2 == 0 && e.Stop() {
					stopped.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	// Every entry either ran or was stopped, exactly once.
	deadline := time.Now().Add(10 * time.Second)
	for ran.Load()+stopped.Load() != 8*n && time.Now().Before(deadline) {
		done := make(chan struct{})
		q.Add(func() { close(done) })
		<-done
	}
	if got := ran.Load() + stopped.Load(); got != 8*n {
		t.Fatalf("ran %d + stopped %d = %d, want %d", ran.Load(), stopped.Load(), got, 8*n)
	}
}
