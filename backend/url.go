package backend

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/go-locker/locker"
)

// ParseURL parses the URL a backend's exported Open is given, for the error
// that url.Parse would return: it wraps locker.ErrInvalidURL, names the
// backend, and quotes no part of the URL, since net/url quotes a fragment
// that may be part of a password (an unescaped '/', '?' or '#' in it ends
// the user info early). Openers registered with locker.Register get a parsed
// URL already; locker.Open redacts its own parse errors the same way.
func ParseURL(backendName, rawURL string) (*url.URL, error) {
	u, err := url.Parse(rawURL)
	if err == nil {
		return u, nil
	}
	msg := err.Error()
	var ue *url.Error
	if errors.As(err, &ue) {
		msg = ue.Err.Error()
	}
	if i, j := strings.IndexByte(msg, '"'), strings.LastIndexByte(msg, '"'); i >= 0 && j > i {
		msg = msg[:i] + "…" + msg[j+1:]
	}
	msg = redactPassword(msg, rawURL)
	return nil, fmt.Errorf("%w: %s: cannot parse URL: %s (percent-encode any '/', '?', '#' or '@' in the user name or password)", locker.ErrInvalidURL, backendName, msg)
}

// redactPassword removes the password of rawURL, as written and unescaped,
// from msg.
func redactPassword(msg, rawURL string) string {
	_, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return msg
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return msg
	}
	if _, pw, ok := strings.Cut(rest[:at], ":"); ok && pw != "" {
		msg = strings.ReplaceAll(msg, pw, "xxxxx")
		if un, err := url.PathUnescape(pw); err == nil && un != pw {
			msg = strings.ReplaceAll(msg, un, "xxxxx")
		}
	}
	return msg
}
