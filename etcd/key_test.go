package etcd

import (
	"strings"
	"testing"
)

func TestEncodeKeyInjective(t *testing.T) {
	keys := []string{"a", "a/b", "a%2Fb", "a%b", "%", "/", "//", "..", ".", "a b", `q"uote`, "*", "{tag}",
		"ключ", "日本", "a/", "/a", "%25", "%2F", strings.Repeat("x/", 512)}
	seen := map[string]string{}
	for _, k := range keys {
		enc := EncodeKey(k)
		if strings.Contains(enc, "/") {
			t.Errorf("EncodeKey(%q) = %q contains '/'", k, enc)
		}
		if other, ok := seen[enc]; ok {
			t.Errorf("EncodeKey(%q) = EncodeKey(%q) = %q", k, other, enc)
		}
		seen[enc] = k
		if dec, ok := DecodeKey(enc); !ok || dec != k {
			t.Errorf("DecodeKey(EncodeKey(%q)) = %q, %v", k, dec, ok)
		}
	}
}

func TestLockDirNoPrefixCollision(t *testing.T) {
	keys := []string{"a", "a/b", "ab", "a/", "a%", "a%2F"}
	for _, x := range keys {
		for _, y := range keys {
			if x == y {
				continue
			}
			dx, dy := LockDir("/locker", x), LockDir("/locker", y)
			if strings.HasPrefix(dy, dx) {
				t.Errorf("the directory of %q (%q) is a prefix of that of %q (%q)", x, dx, y, dy)
			}
		}
	}
}

func TestDecodeKeyRejects(t *testing.T) {
	for _, s := range []string{"a/b", "%", "%2", "%41", "%2f"} {
		if _, ok := DecodeKey(s); ok {
			t.Errorf("DecodeKey(%q) accepted a string EncodeKey cannot produce", s)
		}
	}
}

func FuzzEncodeKey(f *testing.F) {
	f.Add("a/b")
	f.Add("%2F")
	f.Fuzz(func(t *testing.T, k string) {
		enc := EncodeKey(k)
		if strings.Contains(enc, "/") {
			t.Fatalf("EncodeKey(%q) = %q contains '/'", k, enc)
		}
		if dec, ok := DecodeKey(enc); !ok || dec != k {
			t.Fatalf("DecodeKey(EncodeKey(%q)) = %q, %v", k, dec, ok)
		}
	})
}

// The lease's release record lies in no lock directory: no key encodes to
// "%released", so no directory's prefix range (the owner read, TryAcquire's
// compare) ever sees it.
func TestReleaseRecordInNoLockDir(t *testing.T) {
	rec := releaseRecord(DefaultPrefix, 0x1234)
	if want := DefaultPrefix + "/%released/0000000000001234"; rec != want {
		t.Fatalf("releaseRecord = %q, want %q", rec, want)
	}
	if _, ok := DecodeKey("%released"); ok {
		t.Fatal(`DecodeKey("%released") succeeded: some key's lock directory would hold the release records`)
	}
	for _, k := range []string{"%released", "%", "%r", "%25released", "/%released", "%released/0000000000001234", "released"} {
		if dir := LockDir(DefaultPrefix, k); strings.HasPrefix(rec, dir) {
			t.Errorf("the release record %q lies in the lock directory %q of key %q", rec, dir, k)
		}
	}
}
