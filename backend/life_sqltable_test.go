package backend

import "testing"

// TestClosedWithHold: Closed is false until Close takes the held handles,
// and true once a Hold is refused.
func TestClosedWithHold(t *testing.T) {
	l := NewLife[int](nil)
	if l.Closed() || !l.Hold(1) {
		t.Fatal("a new Life is closed, or refuses a Hold")
	}
	var took []int
	if err := l.Close(Closer[int]{Release: func(held []int) error {
		took = held
		if !l.Closed() {
			t.Error("Closed is false while Close releases the held handles")
		}
		return nil
	}}); err != nil {
		t.Fatal(err)
	}
	if !l.Closed() || l.Hold(2) || len(took) != 1 {
		t.Fatalf("after Close: Closed %t, Close took %v; want true, [1] and Hold refused", l.Closed(), took)
	}
}
