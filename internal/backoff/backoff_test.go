package backoff

import (
	"context"
	"testing"
	"time"
)

func TestNextDoublesWithinJitter(t *testing.T) {
	b := New(10*time.Millisecond, 80*time.Millisecond)
	want := []time.Duration{10, 20, 40, 80, 80}
	for i, w := range want {
		w *= time.Millisecond
		if d := b.Next(); d < w/2 || d > w {
			t.Fatalf("Next #%d = %v, want in [%v, %v]", i, d, w/2, w)
		}
	}
	b.Reset()
	if d := b.Next(); d > 10*time.Millisecond {
		t.Fatalf("Next after Reset = %v, want at most 10ms", d)
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep on an ended context = true")
	}
	stop := make(chan struct{})
	close(stop)
	if Sleep(context.Background(), time.Hour, stop) {
		t.Fatal("Sleep with a closed extra channel = true")
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep(1ms) = false")
	}
	if Jitter(0) != 0 || Jitter(-1) != 0 {
		t.Fatal("Jitter of a non-positive duration is not 0")
	}
}
