package locker

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxKeyLen is the longest key, in bytes, that every backend accepts.
const MaxKeyLen = 1024

// ValidateKey reports whether key is a legal lock key: non-empty, valid UTF-8,
// free of NUL bytes and at most MaxKeyLen bytes. Every other string is legal,
// including "/", "..", spaces, quotes, "*", "{tag}" and any unicode; backends
// must encode keys injectively so that distinct keys never share a lock.
// The returned error wraps ErrInvalidKey and says what is wrong.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes long, longer than the limit of %d", ErrInvalidKey, len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidKey)
	case strings.IndexByte(key, 0) >= 0:
		return fmt.Errorf("%w: contains a NUL byte at offset %d", ErrInvalidKey, strings.IndexByte(key, 0))
	}
	return nil
}
