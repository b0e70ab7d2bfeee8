package etcd

import (
	"fmt"
	"strings"
	"testing"
)

// No two (family, key) pairs share a directory, and none lies below
// another's (a directory's range read or watch would see the other's
// keys), nor below the release records; a reader's and a writer's
// sub-directories are apart, and so are those of two limits.
func TestFamilyDirsApart(t *testing.T) {
	keys := []string{"a", "a/b", "ab", "a/", "a%", "a%2F", "%rw", "%sem", "%rw/a", "%sem/a/3", "%released", "r", "w", "3", "a/w", "a/3"}
	kinds := map[string]lockKind{"mutex": mutexKind, "read": readKind, "write": writeKind, "sem1": semaphoreKind(1), "sem3": semaphoreKind(3), "sem30": semaphoreKind(30)}
	type dir struct{ what, dir, sub string }
	var dirs []dir
	for _, k := range keys {
		for name, kind := range kinds {
			tn := turnOf("/locker", k, kind)
			if !strings.HasPrefix(tn.sub, tn.dir) || !strings.HasPrefix(tn.block, tn.dir) {
				t.Errorf("%s %q: sub %q, block %q not under dir %q", name, k, tn.sub, tn.block, tn.dir)
			}
			if strings.HasPrefix(tn.dir, "/locker/%released/") {
				t.Errorf("%s %q: directory %q among the release records", name, k, tn.dir)
			}
			dirs = append(dirs, dir{fmt.Sprintf("%s %q", name, k), tn.dir, tn.sub})
		}
	}
	for _, x := range dirs {
		for _, y := range dirs {
			if x.dir == y.dir {
				// One lock: only its sub-directories differ, and
				// then neither is below the other.
				if x.sub != y.sub && (strings.HasPrefix(y.sub, x.sub) || strings.HasPrefix(x.sub, y.sub)) {
					t.Errorf("%s and %s: sub-directories %q and %q nest", x.what, y.what, x.sub, y.sub)
				}
				continue
			}
			if strings.HasPrefix(y.dir, x.dir) {
				t.Errorf("the directory of %s (%q) is a prefix of that of %s (%q)", x.what, x.dir, y.what, y.dir)
			}
		}
	}
}
