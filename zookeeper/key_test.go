package zookeeper

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/go-locker/locker"
)

// zkRefuses reports whether ZooKeeper's PathUtils.validatePath refuses r in
// a path (it checks UTF-16 code units; runes above U+FFFF are surrogates).
func zkRefuses(r rune) bool {
	return r == 0 || r < 0x20 || r >= 0x7f && r <= 0x9f || r >= 0xd800 && r <= 0xf8ff || r >= 0xfff0
}

func TestEncodeKeyInjectiveAndLegal(t *testing.T) {
	keys := []string{
		"/", "//", "..", ".", " ", "*", "🔒", "zookeeper", "\\", "%", "%25", "%2F", "a/b", "a%2Fb",
		"k", "kk", "é", "e\u0301", "\u0085", "\x01", "\x7f", "\uf8ff", "\ufff0", "\uffef",
		"{tag}", "'quoted'", "\"dq\"", "tab\there", "new\nline", "A", "a",
		strings.Repeat("/", locker.MaxKeyLen), strings.Repeat("🔒", locker.MaxKeyLen/4),
	}
	seen := map[string]string{}
	for _, k := range keys {
		if err := locker.ValidateKey(k); err != nil {
			t.Fatalf("test bug: %q: %v", k, err)
		}
		e := EncodeKey(k)
		if prev, dup := seen[e]; dup {
			t.Errorf("EncodeKey(%q) = EncodeKey(%q) = %q", k, prev, e)
		}
		seen[e] = k
		switch {
		case e == "." || e == ".." || e == "zookeeper" || e == "":
			t.Errorf("EncodeKey(%q) = %q, not a legal path component", k, e)
		case strings.Contains(e, "/"):
			t.Errorf("EncodeKey(%q) = %q contains '/'", k, e)
		case !utf8.ValidString(e):
			t.Errorf("EncodeKey(%q) = %q is not valid UTF-8", k, e)
		}
		for _, r := range e {
			if zkRefuses(r) {
				t.Errorf("EncodeKey(%q) = %q contains %U, which ZooKeeper refuses", k, e, r)
			}
		}
		back, ok := DecodeKey(e)
		if !ok || back != k {
			t.Errorf("DecodeKey(EncodeKey(%q)) = %q, %v", k, back, ok)
		}
	}
}

func TestDecodeKeyRejectsForeignNames(t *testing.T) {
	for _, name := range []string{"", "x", "k%2", "k%zz", "k%2f", "k/", "k%00"} {
		if k, ok := DecodeKey(name); ok {
			t.Errorf("DecodeKey(%q) = %q, true; want false", name, k)
		}
	}
}

func FuzzEncodeKey(f *testing.F) {
	for _, s := range []string{"a", "/", "%", "🔒", "..", "k%25"} {
		f.Add(s, s+"x")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if locker.ValidateKey(a) != nil || locker.ValidateKey(b) != nil {
			return
		}
		if a != b && EncodeKey(a) == EncodeKey(b) {
			t.Fatalf("EncodeKey(%q) == EncodeKey(%q)", a, b)
		}
		if back, ok := DecodeKey(EncodeKey(a)); !ok || back != a {
			t.Fatalf("round trip of %q gave %q, %v", a, back, ok)
		}
	})
}

func TestLockDir(t *testing.T) {
	if got := LockDir("", "a/b"); got != "/locker/ka%2Fb" {
		t.Errorf("LockDir(\"\", a/b) = %q", got)
	}
	if got := LockDir("/app/locks", "x"); got != "/app/locks/kx" {
		t.Errorf("LockDir(/app/locks, x) = %q", got)
	}
}

func TestCheckRoot(t *testing.T) {
	for _, ok := range []string{"/", "/locker", "/a/b", "/a b/ü"} {
		if err := checkRoot(ok); err != nil {
			t.Errorf("checkRoot(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "locker", "/locker/", "/a//b", "/a/./b", "/a/..", "/zookeeper", "/zookeeper/x", "/a\x01"} {
		if err := checkRoot(bad); err == nil {
			t.Errorf("checkRoot(%q) = nil, want an error", bad)
		}
	}
}

func TestParseAndSortNodes(t *testing.T) {
	g1, g2 := strings.Repeat("a", 32), strings.Repeat("b", 32)
	kids := []string{
		nodeName(g2, kindLock, 0) + "0000000010",
		"foreign",
		nodeName(g1, kindLock, 0) + "0000000002",
		"_c_short-lock-0000000001",
		nodeName(g1, kindLock, 0) + "0000000011",
	}
	got := sortNodes(kids)
	if len(got) != 3 || got[0].seq != 2 || got[1].seq != 10 || got[2].seq != 11 || got[1].guid != g2 {
		t.Errorf("sortNodes = %+v", got)
	}
}

// The server's counter wraps from 2147483647 to -2147483648 in a directory
// that never empties: nodes made after the wrap still come after the ones
// made before it.
func TestSortNodesAcrossCounterWrap(t *testing.T) {
	g := strings.Repeat("c", 32)
	kids := []string{
		nodeName(g, kindLock, 0) + "-2147483647", // made third after the wrap
		nodeName(g, kindLock, 0) + "2147483646",  // the holder, made before it
		nodeName(g, kindLock, 0) + "-2147483648", // made second
		nodeName(g, kindLock, 0) + "2147483647",  // made first after the holder
	}
	got := sortNodes(kids)
	var seqs []int64
	for _, n := range got {
		seqs = append(seqs, n.seq)
	}
	want := []int64{2147483646, 2147483647, -2147483648, -2147483647}
	if !slices.Equal(seqs, want) {
		t.Fatalf("order across the wrap: %v, want %v", seqs, want)
	}
	if _, ok := parseNode(nodeName(g, kindLock, 0) + "-000000001"); !ok {
		t.Fatal("a wrapped (negative) sequence is not parsed")
	}
}

// Each family has a keyspace of its own: no two (family, key) pairs share a
// directory, and every directory is one legal path component under the
// root.
func TestFamilyDirsApart(t *testing.T) {
	keys := []string{"k", "r", "s", "kk", "rk", "sk", "a/b", "..", ".", "zookeeper", "%", "🔒", strings.Repeat("x", locker.MaxKeyLen)}
	seen := map[string]string{}
	for _, k := range keys {
		for fam, dir := range map[string]string{
			"mutex":        LockDir("/root", k),
			"rw":           ReadWriteDir("/root", k),
			"semaphore":    SemaphoreDir("/root", k),
			"rw (default)": ReadWriteDir("", k),
		} {
			if prev, dup := seen[dir]; dup {
				t.Errorf("%s %q has the directory %s of %s", fam, k, dir, prev)
			}
			seen[dir] = fam + " " + k
			name, ok := strings.CutPrefix(dir, "/root/")
			if fam == "rw (default)" {
				name, ok = strings.CutPrefix(dir, DefaultRoot+"/")
			}
			if !ok || name == "" || name == "." || name == ".." || name == "zookeeper" || strings.Contains(name, "/") {
				t.Errorf("%s %q: directory %s is not one legal component under its root", fam, k, dir)
			}
		}
	}
	if got := SemaphoreDir("", "render/farm"); got != "/locker/srender%2Ffarm" {
		t.Errorf("SemaphoreDir = %s", got)
	}
	if got := ReadWriteDir("/app/", "config"); got != "/app/rconfig" {
		t.Errorf("ReadWriteDir = %s", got)
	}
}

// A node's name says its kind and, for a permit, its semaphore's limit.
func TestNodeKinds(t *testing.T) {
	g := strings.Repeat("d", 32)
	for _, c := range []struct {
		kind  nodeKind
		limit int
	}{{kindLock, 0}, {kindRead, 0}, {kindWrite, 0}, {kindPermit, 1}, {kindPermit, 3}, {kindPermit, 1 << 40}} {
		for _, seq := range []string{"0000000007", "-000000007"} {
			name := nodeName(g, c.kind, c.limit) + seq
			n, ok := parseNode(name)
			if !ok || n.kind != c.kind || n.limit != c.limit || n.guid != g || n.seq != map[string]int64{"0000000007": 7, "-000000007": -7}[seq] || n.name != name {
				t.Errorf("parseNode(%q) = %+v, %v", name, n, ok)
			}
		}
	}
	for _, bad := range []string{
		"_c_" + g + "-sem-0-0000000001",  // a limit below 1
		"_c_" + g + "-sem-03-0000000001", // not canonical
		"_c_" + g + "-sem--0000000001",   // no limit
		"_c_" + g + "-sem-x-0000000001",
		"_c_" + g + "-sem-3",
		"_c_" + g + "-rd-0000000001",
		"_c_" + g + "-read-",
	} {
		if n, ok := parseNode(bad); ok {
			t.Errorf("parseNode(%q) = %+v, true; want false", bad, n)
		}
	}
}
