package zookeeper

import (
	"errors"
	"testing"

	"github.com/go-locker/locker"
)

func TestErrAtConstruction(t *testing.T) {
	l := New(nil, nil)
	defer l.Close()
	if err := l.Err(); !errors.Is(err, locker.ErrInvalidOption) {
		t.Fatalf("New(nil, nil).Err() = %v, want ErrInvalidOption", err)
	}
}
