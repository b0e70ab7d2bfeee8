package backend

import (
	"net/url"
	"slices"
	"strings"
)

// StripParams returns rawQuery (a URL's RawQuery) without the parameters
// whose name, unescaped, begins with prefix in any case (such as a
// backend's own "lock_" parameters, which the client library must not see).
// The other parameters are kept exactly as written: pgx, for one, decodes
// them as libpq does, where a "+" is a plus sign, not a space as for
// net/url, so decoding and encoding them again could change their values.
func StripParams(rawQuery, prefix string) string {
	prefix = strings.ToLower(prefix)
	return stripIf(rawQuery, func(name string) bool { return strings.HasPrefix(strings.ToLower(name), prefix) })
}

// StripShared returns rawQuery without the shared parameters
// (SharedParams) and without those whose name begins with prefix, in any
// case, keeping the others exactly as written (see StripParams): what a
// backend hands to a client library that would take the rest for its own.
func StripShared(rawQuery, prefix string) string {
	prefix = strings.ToLower(prefix)
	return stripIf(rawQuery, func(name string) bool {
		return strings.HasPrefix(strings.ToLower(name), prefix) || slices.Contains(SharedParams, name)
	})
}

func stripIf(rawQuery string, strip func(name string) bool) string {
	var kept []string
	for pair := range strings.SplitSeq(rawQuery, "&") {
		if pair == "" {
			continue
		}
		name, _, _ := strings.Cut(pair, "=")
		if dec, err := url.QueryUnescape(name); err == nil {
			name = dec
		}
		if !strip(name) {
			kept = append(kept, pair)
		}
	}
	return strings.Join(kept, "&")
}
