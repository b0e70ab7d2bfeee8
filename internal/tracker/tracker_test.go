package tracker

import (
	"testing"
	"time"
)

func TestWait(t *testing.T) {
	var tr Tracker
	if !tr.Wait(0) {
		t.Fatal("Wait on an idle tracker = false")
	}
	tr.Add()
	if tr.Wait(time.Millisecond) {
		t.Fatal("Wait with one active = true")
	}
	waited := make(chan bool)
	go func() { waited <- tr.Wait(-1) }()
	tr.Add() // Add while someone waits
	tr.Done()
	select {
	case <-waited:
		t.Fatal("Wait returned with one still active")
	case <-time.After(20 * time.Millisecond):
	}
	tr.Done()
	if !<-waited {
		t.Fatal("Wait(-1) = false")
	}
}

func TestDoneWithoutAdd(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Done without Add did not panic")
		}
	}()
	var tr Tracker
	tr.Done()
}
