package backend

import (
	"net/url"
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
	var kept []string
	for pair := range strings.SplitSeq(rawQuery, "&") {
		if pair == "" {
			continue
		}
		name, _, _ := strings.Cut(pair, "=")
		if dec, err := url.QueryUnescape(name); err == nil {
			name = dec
		}
		if !strings.HasPrefix(strings.ToLower(name), prefix) {
			kept = append(kept, pair)
		}
	}
	return strings.Join(kept, "&")
}
