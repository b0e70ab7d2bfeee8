package zookeeper

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/go-locker/locker"
)

// DefaultRoot is the parent of every lock directory unless WithPrefix says
// otherwise.
const DefaultRoot = "/locker"

// keyPrefix starts every encoded key, so that no lock directory is named
// ".", ".." or "zookeeper", whatever the key.
const keyPrefix = "k"

// protectedPrefix marks a lock node whose name carries its creator's GUID
// (Curator's and go-zookeeper's convention), so that a client that lost the
// answer to its create can find and adopt its node.
const protectedPrefix = "_c_"

// The requested name of a lock node ends with its kind, then '-': "-lock-"
// (a mutex), "-read-" and "-write-" (a reader-writer lock), or "-sem-<n>-"
// (a permit of a semaphore of n, so that every listing shows each node's
// limit); the server appends a 10-digit sequence number to it.
const (
	nodeSuffix  = "-lock-"
	readSuffix  = "-read-"
	writeSuffix = "-write-"
	semPrefix   = "-sem-"
)

// Each lock family has a keyspace of its own: its directories are named
// after the key as a mutex's are (EncodeKey), with another first letter.
// EncodeKey's names start with keyPrefix, "k"; a reader-writer lock's
// directory name starts with "r" instead, a semaphore's with "s". So no
// two (family, key) pairs share a directory, and none is ".", ".." or
// "zookeeper".
const (
	rwPrefix  = "r"
	semDirPfx = "s"
)

// EncodeKey returns the name of key's lock directory: one path component
// that ZooKeeper accepts, different for every distinct key. It is "k"
// followed by the key with '%', '/' and every character ZooKeeper refuses in
// a path (control characters, U+007F–U+009F, U+D800–U+F8FF, U+FFF0–U+FFFF
// and everything above U+FFFF, which Java sees as surrogates) written as
// %XX, one per UTF-8 byte. The mapping is injective because '%' itself is
// escaped, and the prefix keeps ".", ".." and "zookeeper" from being whole
// components. key must be valid (locker.ValidateKey).
func EncodeKey(key string) string {
	var b strings.Builder
	b.Grow(len(keyPrefix) + len(key))
	b.WriteString(keyPrefix)
	for i := 0; i < len(key); {
		r, w := utf8.DecodeRuneInString(key[i:])
		if needsEscape(r) {
			for j := i; j < i+w; j++ {
				fmt.Fprintf(&b, "%%%02X", key[j])
			}
		} else {
			b.WriteString(key[i : i+w])
		}
		i += w
	}
	return b.String()
}

func needsEscape(r rune) bool {
	switch {
	case r == '%', r == '/':
		return true
	case r < 0x20, r >= 0x7f && r <= 0x9f:
		return true
	case r >= 0xd800 && r <= 0xf8ff, r >= 0xfff0:
		return true
	}
	return false
}

// DecodeKey is the inverse of EncodeKey; it reports false for a name that
// EncodeKey cannot have produced.
func DecodeKey(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, keyPrefix)
	if !ok {
		return "", false
	}
	var b []byte
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if c != '%' {
			b = append(b, c)
			continue
		}
		if i+2 >= len(rest) {
			return "", false
		}
		v, err := strconv.ParseUint(rest[i+1:i+3], 16, 8)
		if err != nil || rest[i+1:i+3] != strings.ToUpper(rest[i+1:i+3]) {
			return "", false
		}
		b = append(b, byte(v))
		i += 2
	}
	key := string(b)
	if locker.ValidateKey(key) != nil || EncodeKey(key) != name {
		return "", false
	}
	return key, true
}

// LockDir returns the path of key's lock directory under root (DefaultRoot
// when empty): where the lock nodes of its holder and waiters live.
func LockDir(root, key string) string {
	if root == "" {
		root = DefaultRoot
	}
	return strings.TrimSuffix(root, "/") + "/" + EncodeKey(key)
}

// ReadWriteDir returns the path of the directory of key's reader-writer
// lock under root (DefaultRoot when empty): LockDir's path with the name's
// "k" turned into "r".
func ReadWriteDir(root, key string) string { return familyDir(root, rwPrefix, key) }

// SemaphoreDir returns the path of the directory of key's semaphore under
// root (DefaultRoot when empty): LockDir's path with the name's "k" turned
// into "s".
func SemaphoreDir(root, key string) string { return familyDir(root, semDirPfx, key) }

func familyDir(root, prefix, key string) string {
	if root == "" {
		root = DefaultRoot
	}
	return strings.TrimSuffix(root, "/") + "/" + prefix + strings.TrimPrefix(EncodeKey(key), keyPrefix)
}

// checkRoot reports whether root is an absolute ZooKeeper path that a lock
// directory can live under.
func checkRoot(root string) error {
	switch {
	case root == "" || root[0] != '/':
		return fmt.Errorf("%w: root %q must be an absolute path such as %s", locker.ErrInvalidOption, root, DefaultRoot)
	case root != "/" && (strings.HasSuffix(root, "/") || path.Clean(root) != root):
		return fmt.Errorf("%w: root %q is not a clean path (no trailing '/', no empty, '.' or '..' components)", locker.ErrInvalidOption, root)
	case root == "/zookeeper" || strings.HasPrefix(root, "/zookeeper/"):
		return fmt.Errorf("%w: root %q is inside ZooKeeper's reserved /zookeeper tree", locker.ErrInvalidOption, root)
	}
	for _, r := range root {
		if r != '/' && needsEscape(r) && r != '%' {
			return fmt.Errorf("%w: root %q contains a character ZooKeeper refuses (%U)", locker.ErrInvalidOption, root, r)
		}
	}
	return nil
}

// newGUID returns 32 hex digits from crypto/rand.
func newGUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// nodeKind is what a lock node asks for of its directory.
type nodeKind uint8

const (
	kindLock   nodeKind = iota // a mutex
	kindRead                   // a reader of a reader-writer lock
	kindWrite                  // a writer of a reader-writer lock
	kindPermit                 // a permit of a semaphore
)

// nodeName is the name (without sequence) a contender with guid creates for
// a node of kind (and, for a permit, the semaphore's limit n).
func nodeName(guid string, kind nodeKind, n int) string {
	switch kind {
	case kindRead:
		return protectedPrefix + guid + readSuffix
	case kindWrite:
		return protectedPrefix + guid + writeSuffix
	case kindPermit:
		return protectedPrefix + guid + semPrefix + strconv.Itoa(n) + "-"
	}
	return protectedPrefix + guid + nodeSuffix
}

// lockNode is one child of a lock directory, parsed.
type lockNode struct {
	name  string
	guid  string
	seq   int64
	kind  nodeKind
	limit int // a permit's semaphore limit; 0 for the other kinds
}

// parseNode parses a child name made by nodeName plus the server's
// sequence; other names (not ours) report false and are ignored.
func parseNode(name string) (lockNode, bool) {
	rest, ok := strings.CutPrefix(name, protectedPrefix)
	if !ok || len(rest) < 32+len(nodeSuffix)+1 {
		return lockNode{}, false
	}
	n := lockNode{name: name, guid: rest[:32]}
	rest = rest[32:]
	var digits string
	switch {
	case strings.HasPrefix(rest, nodeSuffix):
		digits = rest[len(nodeSuffix):]
	case strings.HasPrefix(rest, readSuffix):
		n.kind, digits = kindRead, rest[len(readSuffix):]
	case strings.HasPrefix(rest, writeSuffix):
		n.kind, digits = kindWrite, rest[len(writeSuffix):]
	case strings.HasPrefix(rest, semPrefix):
		limit, seq, ok := strings.Cut(rest[len(semPrefix):], "-")
		v, err := strconv.Atoi(limit)
		if !ok || err != nil || v < 1 || strconv.Itoa(v) != limit {
			return lockNode{}, false
		}
		n.kind, n.limit, digits = kindPermit, v, seq
	default:
		return lockNode{}, false
	}
	// The server's counter is a signed 32-bit number ("%010d"), negative
	// once it has wrapped.
	seq, err := strconv.ParseInt(digits, 10, 32)
	if err != nil {
		return lockNode{}, false
	}
	n.seq = seq
	return n, true
}

// sortNodes parses children and returns ours in sequence order. The server
// appends the directory's signed 32-bit child counter, which goes up with
// every create and delete in it; a directory that never empties (a key
// always contended, or persistent directories: WithoutContainers) wraps it
// after about a billion acquisitions, from 2147483647 to -2147483648. So
// sequences are compared as serial numbers (RFC 1982): a before b when
// b − a, in 32-bit arithmetic, is positive. That is the order of creation
// for any nodes created less than 2^31 counter steps apart, which the
// nodes present at one time always are.
func sortNodes(children []string) []lockNode {
	out := make([]lockNode, 0, len(children))
	for _, c := range children {
		if n, ok := parseNode(c); ok {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, func(a, b lockNode) int {
		if d := seqDiff(a.seq, b.seq); d != 0 {
			return d
		}
		return strings.Compare(a.name, b.name)
	})
	return out
}

// seqDiff compares two sequences as 32-bit serial numbers: -1 when a comes
// before b, 1 after, 0 equal.
func seqDiff(a, b int64) int {
	d := int32(uint32(a) - uint32(b))
	switch {
	case d < 0:
		return -1
	case d > 0:
		return 1
	}
	return 0
}
