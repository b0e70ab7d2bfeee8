package redis

// Unit tests that need no server. The tests against real Redis servers (the
// conformance suite, fault, cluster, TLS, Sentinel and ACL tests, and the
// benchmarks) live in the test module, in integration/redis.

import (
	"context"
	"encoding/base64"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/lease"
)

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestKeyEncoding(t *testing.T) {
	l := New(nil)
	seen := map[string]string{}
	for _, k := range []string{"a", "b", "{a}", "a}", "{", "}", "}{", "a:lock", "a}:fence", "ключ", "x/../y", "*", " ", "\"'", strings.Repeat("z", locker.MaxKeyLen)} {
		ks := l.keysFor(k)
		for _, name := range []string{ks.lock, ks.fence, ks.wake, ks.released, ks.queue, ks.waiters} {
			if prev, dup := seen[name]; dup {
				t.Errorf("keys %q and %q share the Redis name %q", prev, k, name)
			}
			seen[name] = k
			// The hash tag is the part between the first "{" and the next
			// "}"; it must be the same for all three names of one key.
			open := strings.IndexByte(name, '{')
			end := strings.IndexByte(name[open:], '}')
			if open < 0 || end <= 1 {
				t.Fatalf("%q has no hash tag", name)
			}
			if tag := name[open : open+end+1]; !strings.HasPrefix(ks.lock, DefaultPrefix+tag) || !strings.HasPrefix(ks.fence, DefaultPrefix+tag) || !strings.HasPrefix(ks.released, DefaultPrefix+tag) ||
				!strings.HasPrefix(ks.queue, DefaultPrefix+tag) || !strings.HasPrefix(ks.waiters, DefaultPrefix+tag) || !strings.HasPrefix(ks.wakeBase, DefaultPrefix+tag) {
				t.Errorf("names of %q do not share the hash tag %q: %+v", k, tag, ks)
			}
		}
	}
}

// TestKeyNames: the exported names are the ones the scripts use, laid out
// as the package documentation says: <prefix>{base64url(key)}:lock, :fence
// and :wake:<Locker id> (and :released-by:, :queue and :waiters, which KeyNames
// does not return); each Locker has a wake-up channel of its own.
func TestKeyNames(t *testing.T) {
	for _, tc := range []struct {
		prefix, key, tag string
	}{
		{DefaultPrefix, "invoice/42", "{aW52b2ljZS80Mg}"},
		{"app:", "ключ?", "{0LrQu9GO0Yc_}"},
		{"", "{a}:lock", "{" + base64.RawURLEncoding.EncodeToString([]byte("{a}:lock")) + "}"},
	} {
		var opts []Option
		if tc.prefix != DefaultPrefix {
			opts = append(opts, WithPrefix(tc.prefix))
		}
		l := New(nil, opts...)
		lock, fence, wake := l.KeyNames(tc.key)
		base := tc.prefix + tc.tag
		if lock != base+":lock" || fence != base+":fence" || wake != base+":wake:"+l.id {
			t.Errorf("prefix %q, key %q: KeyNames = %q, %q, %q; want %q + :lock, :fence, :wake:%s", tc.prefix, tc.key, lock, fence, wake, base, l.id)
		}
		want := keys{lock: lock, fence: fence, wake: wake, released: base + ":released-by:", queue: base + ":queue", waiters: base + ":waiters", wakeBase: base + ":wake:"}
		if k := l.keysFor(tc.key); k != want {
			t.Errorf("prefix %q, key %q: KeyNames = %q, %q, %q, but the scripts use %+v", tc.prefix, tc.key, lock, fence, wake, k)
		}
		if _, _, other := New(nil, opts...).KeyNames(tc.key); other == wake {
			t.Errorf("two Lockers share the wake-up channel %q", wake)
		}
		if strings.Contains(l.id, ":") {
			t.Errorf("Locker id %q contains the queue entry separator", l.id)
		}
	}
}

// TestHandleOwner: Owner is the token the scripts compare, and tokens of
// two acquisitions differ.
func TestHandleOwner(t *testing.T) {
	l := New(nil)
	owner := lease.NewOwner()
	h := newHandle(l, "k", l.keysFor("k"), owner, nil, 1, time.Second, 100*time.Millisecond, time.Now())
	if h.Owner() != owner {
		t.Errorf("Owner() = %q, want %q", h.Owner(), owner)
	}
	if len(owner) != 22 || owner == lease.NewOwner() {
		t.Errorf("owner tokens must be 128 random bits in base64url (22 characters), got %q", owner)
	}
}

// TestOptionsRejectedOffline: invalid options are reported by the first
// acquire, before any request is sent (the client points at a port where
// nothing listens, so a request would fail with a connection error instead).
// TestOptionsRejected in integration/redis checks the same against a real
// server, and that the boundary values are accepted.
func TestOptionsRejectedOffline(t *testing.T) {
	ctx := testCtx(t)
	client := func() goredis.UniversalClient {
		c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { _ = ring.Close() })
	for name, l := range map[string]*Locker{
		"TTL below minimum":                 New(client(), WithDefaultTTL(locker.MinTTL/2)),
		"drift over half TTL":               New(client(), WithDefaultTTL(time.Second), WithDriftMargin(600*time.Millisecond)),
		"drift not positive":                New(client(), WithDriftMargin(0)),
		"retry interval":                    New(client(), WithRetryInterval(0)),
		"fence expiry without clock tokens": New(client(), WithFenceExpiry(time.Hour)),
		"fence expiry too short":            New(client(), WithClockTokens(true), WithFenceExpiry(MinFenceExpiry-time.Second)),
		"nil client":                        New(nil),
		"ring":                              New(ring),
	} {
		t.Cleanup(func() { _ = l.Close() })
		if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, locker.ErrInvalidOption) {
			t.Errorf("%s: TryAcquire: %v, want an error wrapping ErrInvalidOption", name, err)
		}
		if _, err := l.Acquire(ctx, "k"); !errors.Is(err, locker.ErrInvalidOption) {
			t.Errorf("%s: Acquire: %v, want an error wrapping ErrInvalidOption", name, err)
		}
	}
	l := New(client())
	t.Cleanup(func() { _ = l.Close() })
	if _, err := l.TryAcquire(ctx, "k", locker.WithTTL(locker.MinTTL-time.Millisecond)); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("per-call TTL below MinTTL: %v, want an error wrapping ErrInvalidOption", err)
	}
	if _, err := l.TryAcquire(ctx, "k", locker.WithTTL(locker.MaxTTL+time.Millisecond)); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("per-call TTL above MaxTTL: %v, want an error wrapping ErrInvalidOption", err)
	}
	if _, err := l.TryAcquire(ctx, "k", locker.WithTTL(math.MaxInt64)); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("per-call TTL of math.MaxInt64: %v, want an error wrapping ErrInvalidOption", err)
	}
}
