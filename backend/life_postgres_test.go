package backend

import (
	"testing"
	"time"
)

func TestSettleWaitsBoundedly(t *testing.T) {
	l := NewLife[int](nil)
	if !l.Settle(time.Millisecond) {
		t.Fatal("Settle with nothing in progress = false")
	}
	stop := make(chan struct{})
	l.Go(func() { <-stop })
	start := time.Now()
	if l.Settle(20 * time.Millisecond) {
		t.Fatal("Settle with a goroutine in progress = true")
	}
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Errorf("Settle returned after %v, before its bound", d)
	}
	go func() { time.Sleep(10 * time.Millisecond); close(stop) }()
	var shut bool
	err := l.Close(Closer[int]{
		Grace: time.Millisecond,
		Shutdown: func() error {
			// The goroutine ends after the grace: Shutdown's Settle sees it end.
			shut = l.Settle(time.Minute)
			return nil
		},
	})
	if err != nil || !shut {
		t.Fatalf("Close = %v, Settle in Shutdown = %v", err, shut)
	}
	if l.Active() != 0 {
		t.Errorf("Active() = %d after Close", l.Active())
	}
}
