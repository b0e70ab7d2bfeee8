package conformance

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// keysIndependent: a held key does not block another.
func (s *suite) keysIndependent(t *testing.T, ctx context.Context) {
	a, b := s.newLocker(t), s.newLocker(t)
	k1, k2 := key(t, "/1"), key(t, "/2")
	h1 := mustAcquire(t, ctx, a, k1)
	h2 := mustTry(t, ctx, b, k2)
	h3 := mustTry(t, ctx, a, key(t, "/3"))
	mustRelease(t, ctx, h1)
	mustRelease(t, ctx, h2)
	mustRelease(t, ctx, h3)
}

// manyHeld: one client holds many keys at once; another client is shut out
// of each, and gets them all after release.
func (s *suite) manyHeld(t *testing.T, ctx context.Context) {
	a, b := s.newLocker(t), s.newLocker(t)
	n := s.h.ManyKeys
	base := key(t, "/")
	keys := make([]string, n)
	for i := range keys {
		keys[i] = base + itoa(i)
	}
	start := time.Now()
	handles := make([]locker.Handle, n)
	parallel(t, n, func(i int) error {
		h, err := a.TryAcquire(ctx, keys[i])
		handles[i] = h
		return err
	})
	if t.Failed() {
		return
	}
	t.Logf("%d keys held by one client, taken in %v", n, time.Since(start))
	for _, i := range sample(n, 100) {
		if isClosed(handles[i].Done()) {
			// Not a second holder: the first one lost the lock and was told.
			// Still a failure here (nothing faulted), but a different one.
			t.Fatalf("the holder of %q, one of %d keys held by one client, lost it with no fault injected: %v", keys[i], n, handles[i].Err())
		}
		mustNotTry(t, ctx, b, keys[i], "another client holds it among many")
	}
	parallel(t, n, func(i int) error { return handles[i].Release(ctx) })
	for _, i := range sample(n, 100) {
		mustRelease(t, ctx, mustTry(t, ctx, b, keys[i]))
	}
}

// parallel runs fn(0..n-1) on a few goroutines and fails t with the errors.
func parallel(t *testing.T, n int, fn func(i int) error) {
	t.Helper()
	const workers = 16
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		next = make(chan int)
	)
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d operations failed; first: %v", len(errs), n, errs[0])
	}
}

// sample returns up to k indices spread over [0, n).
func sample(n, k int) []int {
	if n <= k {
		k = n
	}
	out := make([]int, 0, k)
	for i := range k {
		out = append(out, i*n/k)
	}
	return out
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b [20]byte
	p := len(b)
	for ; i > 0; i /= 10 {
		p--
		b[p] = byte('0' + i%10)
	}
	return string(b[p:])
}

// unusualKeys returns legal keys that trip naive encodings: path syntax
// (and what path cleaning would make of it), glob and hash-tag characters,
// separators a backend might use itself, percent-encodings, case, trimmed
// spaces, unicode in both normal forms, and the longest legal keys, two of
// which differ only in their last byte (a backend that truncates keys, to a
// column width or a name limit, makes them share a lock).
func unusualKeys(base string) []string {
	long := base + "/" + strings.Repeat("z", locker.MaxKeyLen-len(base)-2)
	keys := []string{
		base + "/a/b/../c",
		base + "/a/c",
		base + "/a/./b",
		base + "/a/b",
		base + "/a_b",
		base + "/a%2Fb",
		base + "/a%2fb",
		base + "/a:b",
		base + "/A/b",
		base + "/a/b/",
		base + "//a/b",
		base + "/a\\b",
		base + " spaces in a key ",
		base + " spaces in a key",
		base + `"double" 'single' ` + "`back`",
		base + "*glob?[x]",
		base + "{tag}",
		base + "{",
		base + "}",
		base + "/x",
		base + "/x:fence",
		base + "/x}:fence",
		base + "/x:lock",
		base + "ünïcödé/日本語/🔒",
		base + "/caf\u00e9",  // é precomposed (NFC)
		base + "/cafe\u0301", // e and a combining acute accent (NFD)
		base + "\n\t\r",
		base + "%00",
		base + "\x01\x1f\x1b[0m",
		base + "\x7f",
		base + "\u0085\u2028",
		base + `\`,
		base + `\\`,
		base + `\\\\`,
		base + `\/`,
		base + "/zookeeper",
		base + "/..",
		base + "/.",
		base + "#frag?q=1&r=2",
		base + "/" + strings.Repeat("x", locker.MaxKeyLen-len(base)-1),
		base + "/" + strings.Repeat("y", locker.MaxKeyLen-len(base)-1),
		long + "1",
		long + "2",
	}
	// A 1024-byte key of two-byte runes (and one filler byte if needed).
	uni := base + "/"
	if (locker.MaxKeyLen-len(uni))%2 == 1 {
		uni += "u"
	}
	uni += strings.Repeat("é", (locker.MaxKeyLen-len(uni))/2)
	return append(keys, uni)
}

// bareKeys are legal keys that trip naive encodings only when they stand
// alone: a key that is a whole path component "..", "." or "zookeeper", a
// lone separator or glob. They cannot be made unique to a run, so another
// run of the suite on the same server may hold one for a moment; the case
// waits for them instead of trying once.
var bareKeys = []string{"/", "..", ".", " ", "*", "🔒", "zookeeper", "\\"}

// unusualKeys: every legal key works, and distinct keys never share a lock.
//
// One Locker takes a batch of keys and holds them all at once: as locks
// are not reentrant (Acquire/NotReentrant), two distinct keys of the batch
// that shared a lock would make the second take fail. The batches are
// pairs of chunks of at most Harness.ManyKeys keys in all (a backend may
// pin a connection per lock), so every pair of keys is held together in
// some batch. Another Locker is shut out of each key while it is held,
// and gets each once released. That checks every pair in a few hundred
// operations (a pairwise loop costs thousands of writes, each fsynced on
// some servers).
func (s *suite) unusualKeys(t *testing.T, ctx context.Context) {
	a, b := s.newLocker(t), s.newLocker(t)
	keys := unusualKeys(key(t, ""))
	for _, k := range keys {
		if err := locker.ValidateKey(k); err != nil {
			t.Fatalf("suite bug: %q is not a legal key: %v", truncate(k), err)
		}
	}
	all := append(keys[:len(keys):len(keys)], bareKeys...)
	// take takes k for l: the bare keys with Acquire, since another run of
	// the suite on the same server may hold one for a moment.
	take := func(l locker.Locker, k string) (locker.Handle, error) {
		if !slices.Contains(bareKeys, k) {
			return l.TryAcquire(ctx, k)
		}
		wctx, cancel := context.WithTimeout(ctx, s.h.ExpiryBound+prompt)
		defer cancel()
		return l.Acquire(wctx, k)
	}
	var shared []string
	shutOut := make([]bool, len(all))
	for _, batch := range keyBatches(len(all), s.h.ManyKeys) {
		held := make(map[int]locker.Handle, len(batch))
		for _, i := range batch {
			h, err := take(a, all[i])
			if err != nil {
				shared = append(shared, fmt.Sprintf("%q (%v)", truncate(all[i]), err))
				continue
			}
			held[i] = h
			if h.Key() != all[i] {
				t.Errorf("Key() = %q, want %q: keys must not be altered", truncate(h.Key()), truncate(all[i]))
			}
		}
		for _, i := range batch {
			if held[i] != nil && !shutOut[i] {
				shutOut[i] = true
				mustNotTry(t, ctx, b, all[i], "another client holds the same unusual key")
			}
		}
		for _, i := range batch {
			if h := held[i]; h != nil {
				if err := h.Release(ctx); err != nil {
					t.Errorf("Release(%q): %v", truncate(all[i]), err)
				}
			}
		}
		if len(shared) > 0 {
			break
		}
	}
	if len(shared) > 0 {
		const show = 3
		more := ""
		if len(shared) > show {
			more = fmt.Sprintf(" and %d more", len(shared)-show)
			shared = shared[:show]
		}
		t.Errorf("one Locker holding other unusual keys at once could not take: %s%s (distinct keys share a lock, or the key does not work)", strings.Join(shared, ", "), more)
	}
	for _, k := range all {
		hb, err := take(b, k)
		if err != nil {
			t.Errorf("TryAcquire(%q) after its holder released it: %v", truncate(k), err)
			continue
		}
		if err := hb.Release(ctx); err != nil {
			t.Errorf("Release(%q): %v", truncate(k), err)
		}
	}
}

// keyBatches returns batches of indices 0..n-1, each of at most limit
// indices, such that every pair of indices is in some batch: all of them
// when they fit, else every pair of chunks of limit/2.
func keyBatches(n, limit int) [][]int {
	if n <= limit {
		return [][]int{seq(0, n)}
	}
	c := max(1, limit/2)
	var chunks [][]int
	for lo := 0; lo < n; lo += c {
		chunks = append(chunks, seq(lo, min(lo+c, n)))
	}
	var out [][]int
	for i := range chunks {
		for j := i + 1; j < len(chunks); j++ {
			out = append(out, append(slices.Clone(chunks[i]), chunks[j]...))
		}
	}
	return out
}

// seq returns lo, lo+1, ..., hi-1.
func seq(lo, hi int) []int {
	out := make([]int, 0, hi-lo)
	for i := lo; i < hi; i++ {
		out = append(out, i)
	}
	return out
}

// invalidKeys: illegal keys fail at once with ErrInvalidKey, on both calls.
func (s *suite) invalidKeys(t *testing.T, ctx context.Context) {
	l := s.newLocker(t)
	bad := map[string]string{
		"empty":         "",
		"invalid UTF-8": "bad\xff\xfekey",
		"NUL byte":      "a\x00b",
		"1025 bytes":    strings.Repeat("k", locker.MaxKeyLen+1),
	}
	for name, k := range bad {
		for _, call := range []struct {
			name string
			fn   func(context.Context, string, ...locker.Option) (locker.Handle, error)
		}{{"Acquire", l.Acquire}, {"TryAcquire", l.TryAcquire}} {
			cctx, cancel := context.WithTimeout(ctx, prompt)
			h, err := call.fn(cctx, k)
			cancel()
			if err == nil {
				_ = h.Release(ctx)
				t.Errorf("%s with a key that is %s succeeded", call.name, name)
				continue
			}
			if !errors.Is(err, locker.ErrInvalidKey) {
				t.Errorf("%s with a key that is %s: %v, want an error wrapping locker.ErrInvalidKey", call.name, name, err)
			}
		}
	}
}

// invalidTTL: a TTL that is zero, negative or outside the portable range
// [locker.MinTTL, locker.MaxTTL] is refused, on every backend alike, with
// an error wrapping ErrInvalidOption that names the range, and a refused
// call holds nothing.
func (s *suite) invalidTTL(t *testing.T, ctx context.Context) {
	a, b := s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	for _, d := range []time.Duration{0, -time.Second, locker.MinTTL / 2, locker.MinTTL - time.Nanosecond, locker.MaxTTL + time.Nanosecond} {
		for _, call := range []struct {
			name string
			fn   func(context.Context, string, ...locker.Option) (locker.Handle, error)
		}{{"Acquire", a.Acquire}, {"TryAcquire", a.TryAcquire}} {
			h, err := call.fn(ctx, k, locker.WithTTL(d))
			switch {
			case err == nil:
				_ = h.Release(ctx)
				t.Errorf("%s with WithTTL(%v) succeeded; a TTL outside [%v, %v] is refused on every backend", call.name, d, locker.MinTTL, locker.MaxTTL)
			case !errors.Is(err, locker.ErrInvalidOption):
				t.Errorf("%s with WithTTL(%v): %v, want an error wrapping locker.ErrInvalidOption", call.name, d, err)
			case !strings.Contains(err.Error(), locker.MinTTL.String()) || !strings.Contains(err.Error(), locker.MaxTTL.String()):
				t.Errorf("%s with WithTTL(%v): %v, want the error to name the range [%v, %v]", call.name, d, err, locker.MinTTL, locker.MaxTTL)
			}
		}
	}
	// Nothing may be left held by the rejected calls.
	mustRelease(t, ctx, mustTry(t, ctx, b, k))
}

// hugeTTL: a TTL far above the portable range (the largest Duration, a
// century) is refused with ErrInvalidOption (locker.WithTTL refuses it):
// never passed to the server to fail there with a raw error, never wrapped
// around to a negative or tiny lease.
func (s *suite) hugeTTL(t *testing.T, ctx context.Context) {
	a, b := s.newLocker(t), s.newLocker(t)
	for i, d := range []time.Duration{math.MaxInt64, 100 * 365 * 24 * time.Hour, math.MaxInt64 / 1000} {
		k := key(t, "/"+itoa(i))
		h, err := a.TryAcquire(ctx, k, locker.WithTTL(d))
		if err == nil {
			_ = h.Release(ctx)
			t.Errorf("TryAcquire with WithTTL(%v) succeeded; a TTL above locker.MaxTTL %v is refused on every backend", d, locker.MaxTTL)
		} else if !errors.Is(err, locker.ErrInvalidOption) {
			t.Errorf("TryAcquire with WithTTL(%v): %v, want an error wrapping locker.ErrInvalidOption", d, err)
		}
		mustRelease(t, ctx, mustTry(t, ctx, b, k))
	}
}
