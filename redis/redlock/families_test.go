package redlock

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
)

func TestWakeTargets(t *testing.T) {
	for payload, want := range map[string][]string{
		"1":           nil, // the mutex's release: every waiter
		"q pa pb":     {"pa", "pb"},
		"q wX":        {"wX"},
		"q ":          {},
		"quite a lot": nil,
	} {
		got := wakeTargets(payload)
		if (got == nil) != (want == nil) || !slices.Equal(got, want) {
			t.Errorf("wakeTargets(%q) = %q, want %q", payload, got, want)
		}
	}
}

// Each family has names of its own: no name of a family's lock is a name
// of the mutex's or of the other family's lock of the same key.
func TestFamilyNamesApart(t *testing.T) {
	l := New([]goredis.UniversalClient(nil))
	for _, key := range []string{"k", "k:sem", "k}:rw", "{k}", "ü/..", ""} {
		lock, fence, channel := l.KeyNames(key)
		sem, rw := l.FamilyNames(key)
		mutex := []string{lock, fence, channel}
		for _, base := range []string{sem, rw} {
			for _, m := range mutex {
				if len(m) >= len(base) && m[:len(base)] == base {
					t.Errorf("key %q: mutex name %q lies under family base %q", key, m, base)
				}
			}
		}
		if sem == rw {
			t.Errorf("key %q: the semaphore and the reader-writer lock share %q", key, sem)
		}
	}
}

func TestSemaphoreLimitRange(t *testing.T) {
	// Clients that are never contacted: the limit is refused first.
	var cs []goredis.UniversalClient
	for _, a := range []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"} {
		c := goredis.NewClient(&goredis.Options{Addr: a, ContextTimeoutEnabled: true})
		defer c.Close()
		cs = append(cs, c)
	}
	l := New(cs)
	defer l.Close()
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, -1, MaxSemaphoreLimit + 1} {
		_, err := l.TryAcquireSemaphore(context.Background(), "k", n)
		if !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), "limit") {
			t.Errorf("TryAcquireSemaphore(n=%d): %v, want ErrInvalidOption naming the limit", n, err)
		}
		var le *locker.Error
		if !errors.As(err, &le) || le.Op != "try-acquire-semaphore" || le.Key != "k" {
			t.Errorf("TryAcquireSemaphore(n=%d): %v, want a locker.Error of op try-acquire-semaphore naming the key", n, err)
		}
	}
}
