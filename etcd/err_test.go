package etcd

import (
	"errors"
	"testing"

	"github.com/go-locker/locker"
)

func TestErrAtConstruction(t *testing.T) {
	l := New(nil)
	defer l.Close()
	if err := l.Err(); !errors.Is(err, locker.ErrInvalidOption) {
		t.Fatalf("New(nil).Err() = %v, want ErrInvalidOption", err)
	}
}
