package memlock

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

func TestOpen(t *testing.T) {
	tests := []struct {
		url     string
		wantTTL time.Duration
		wantErr []error // all must match; nil means success
	}{
		{"mem://", locker.DefaultTTL, nil},
		{"mem:///", locker.DefaultTTL, nil},
		{"MEM://jobs", locker.DefaultTTL, nil},
		{"mem://jobs?ttl=10s", 10 * time.Second, nil},
		{"mem://?ttl=1s", time.Second, nil},
		{"mem://?ttl=1ms", 0, []error{locker.ErrInvalidURL, locker.ErrInvalidOption}},
		{"mem://jobs?ttl=0s", 0, []error{locker.ErrInvalidURL}},
		{"mem://jobs?ttl=soon", 0, []error{locker.ErrInvalidURL}},
		{"mem://jobs?ttl=500us", 0, []error{locker.ErrInvalidURL, locker.ErrInvalidOption}},
		{"mem://jobs?ttl=1s&ttl=2s", 0, []error{locker.ErrInvalidURL}},
		{"mem://jobs?retry=3", 0, []error{locker.ErrInvalidURL}},
		{"mem://jobs/sub", 0, []error{locker.ErrInvalidURL}},
		{"mem://jobs:80", 0, []error{locker.ErrInvalidURL}},
		{"mem://jobs#x", 0, []error{locker.ErrInvalidURL}},
		{"mem:jobs", 0, []error{locker.ErrInvalidURL}},
		{"mem://user:s3cret@jobs", 0, []error{locker.ErrInvalidURL}},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			l, err := locker.Open(t.Context(), tt.url)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				if got := l.(*Locker).cfg.TTL; got != tt.wantTTL {
					t.Fatalf("default TTL %v, want %v", got, tt.wantTTL)
				}
				return
			}
			if err == nil {
				l.Close()
				t.Fatal("no error")
			}
			for _, want := range tt.wantErr {
				if !errors.Is(err, want) {
					t.Errorf("err = %v, want it to wrap %v", err, want)
				}
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error echoes the password: %v", err)
			}
		})
	}
}

// TestOpenKeyspaces: one name, one keyspace; mem:// is New's store.
func TestOpenKeyspaces(t *testing.T) {
	open := func(u string) locker.Locker {
		l, err := locker.Open(t.Context(), u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	key := "memlock-test/" + t.Name()
	tests := []struct {
		first, second locker.Locker
		shared        bool
	}{
		{open("mem://ks-a"), open("mem://ks-a"), true},
		{open("mem://ks-a"), open("mem://ks-b"), false},
		{open("mem://ks-a"), open("mem://KS-A"), false},
		{open("mem://"), New(), true},
		{open("mem://"), open("mem://ks-a"), false},
	}
	for i, tt := range tests {
		t.Cleanup(func() { _ = tt.second.Close() })
		h, err := tt.first.TryAcquire(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		h2, err := tt.second.TryAcquire(t.Context(), key)
		if shared := errors.Is(err, locker.ErrNotAcquired); shared != tt.shared {
			t.Errorf("case %d: shared keyspace = %v, want %v (err %v)", i, shared, tt.shared, err)
		}
		if err == nil {
			_ = h2.Release(t.Context())
		}
		_ = h.Release(t.Context())
	}
}
