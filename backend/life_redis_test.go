package backend

import "testing"

func TestCallRefusedOnceCloseBegan(t *testing.T) {
	l := NewLife[int](nil)
	ran := false
	if !l.Call(func() {
		ran = true
		if l.Active() != 1 {
			t.Errorf("Active in Call = %d, want 1", l.Active())
		}
	}) || !ran {
		t.Fatal("Call before Close did not run f")
	}
	if l.Active() != 0 {
		t.Fatalf("Active after Call = %d, want 0", l.Active())
	}
	if err := l.Close(Closer[int]{}); err != nil {
		t.Fatal(err)
	}
	if l.Call(func() { t.Error("f ran after Close") }) {
		t.Error("Call after Close = true")
	}
}
