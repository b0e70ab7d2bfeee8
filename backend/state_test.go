package backend

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

func TestEndOnce(t *testing.T) {
	s := NewState()
	if s.Ended() || s.Err() != nil {
		t.Fatal("a new State is ended")
	}
	first, second := errors.New("first"), errors.New("second")
	var (
		wg    sync.WaitGroup
		wins  atomic.Int32
		start = make(chan struct{})
	)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			err := first
			if i%2 == 1 {
				err = second
			}
			if s.End(err) {
				wins.Add(1)
			}
			<-s.Done() // closed by whichever End came first
			if s.Err() == nil {
				t.Error("Err() is nil after Done() closed")
			}
		}()
	}
	close(start)
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d End calls reported being first, want 1", wins.Load())
	}
	got := s.Err()
	if !s.Ended() || (got != first && got != second) {
		t.Fatalf("Ended()=%v Err()=%v", s.Ended(), got)
	}
	if s.End(errors.New("late")) || s.Err() != got {
		t.Fatal("a late End changed the state")
	}
}
