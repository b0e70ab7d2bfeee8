package redis

import (
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
)

func TestErrAtConstruction(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	for name, l := range map[string]*Locker{
		"TTL below minimum": New(c, WithDefaultTTL(locker.MinTTL/2)),
		"retry interval":    New(c, WithRetryInterval(0)),
		"nil client":        New(nil),
	} {
		t.Cleanup(func() { _ = l.Close() })
		if err := l.Err(); !errors.Is(err, locker.ErrInvalidOption) {
			t.Errorf("%s: Err() = %v, want ErrInvalidOption", name, err)
		}
	}
	l := New(c, WithDefaultTTL(time.Minute))
	t.Cleanup(func() { _ = l.Close() })
	if err := l.Err(); err != nil {
		t.Errorf("Err() of a well-built Locker = %v", err)
	}
}
