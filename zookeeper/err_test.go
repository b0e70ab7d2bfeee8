package zookeeper

import (
	"errors"
	"fmt"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
)

func TestErrAtConstruction(t *testing.T) {
	l := New(nil, nil)
	defer l.Close()
	if err := l.Err(); !errors.Is(err, locker.ErrInvalidOption) {
		t.Fatalf("New(nil, nil).Err() = %v, want ErrInvalidOption", err)
	}
}

func TestSessionExpiredStartsOver(t *testing.T) {
	if !sessionEnded(fmt.Errorf("listing: %w", zk.ErrSessionExpired)) || !sessionEnded(errNodeGone) {
		t.Fatal("a request answered \"session expired\" must make a waiting Acquire start over")
	}
	if sessionEnded(zk.ErrConnectionClosed) || sessionEnded(zk.ErrNoAuth) {
		t.Fatal("sessionEnded matched an error that leaves the session alive")
	}
}
