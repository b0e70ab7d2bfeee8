package sqltable_test

import (
	"errors"
	"testing"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/sqltable"
)

func TestErrAtConstruction(t *testing.T) {
	l := sqltable.New(nil)
	defer l.Close()
	if err := l.Err(); !errors.Is(err, locker.ErrInvalidOption) {
		t.Fatalf("New(nil).Err() = %v, want ErrInvalidOption", err)
	}
}
