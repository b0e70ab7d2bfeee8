package etcd

import "strings"

// EncodeKey returns the name of key's lock directory below the prefix: the
// key with '%' and '/' percent-escaped. The result never contains '/', so
// the directory <prefix>/<EncodeKey(key)>/ of one key is never a prefix of
// another key's directory ("a" and "a/b" stay apart), and the escaping is
// injective (decodable), so distinct keys never share a lock.
func EncodeKey(key string) string {
	if !strings.ContainsAny(key, "%/") {
		return key
	}
	var b strings.Builder
	b.Grow(len(key) + 8)
	for i := 0; i < len(key); i++ {
		switch c := key[i]; c {
		case '%':
			b.WriteString("%25")
		case '/':
			b.WriteString("%2F")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// DecodeKey reverses EncodeKey; ok is false for a string EncodeKey cannot
// have produced.
func DecodeKey(enc string) (key string, ok bool) {
	if strings.IndexByte(enc, '/') >= 0 {
		return "", false
	}
	if strings.IndexByte(enc, '%') < 0 {
		return enc, true
	}
	var b strings.Builder
	for i := 0; i < len(enc); i++ {
		if enc[i] != '%' {
			b.WriteByte(enc[i])
			continue
		}
		switch {
		case strings.HasPrefix(enc[i:], "%25"):
			b.WriteByte('%')
		case strings.HasPrefix(enc[i:], "%2F"):
			b.WriteByte('/')
		default:
			return "", false
		}
		i += 2
	}
	return b.String(), true
}

// LockDir returns the etcd key prefix of key's lock directory: every
// contender's waiter key lies directly below it.
func LockDir(prefix, key string) string {
	return prefix + "/" + EncodeKey(key) + "/"
}
