package backend

import (
	"context"
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

// Redact returns msg with every secret of u blanked out ("xxxxx"): its
// password and the values of query parameters whose name contains
// "password", each as written, query-escaped and path-escaped (a client
// library's error may quote any of them). For the errors of an Opener that
// passes the URL, or parts of it, to a client library.
func Redact(msg string, u *url.URL) string {
	var secrets []string
	if u.User != nil {
		if pw, ok := u.User.Password(); ok {
			secrets = append(secrets, pw)
		}
	}
	for name, vs := range u.Query() {
		if strings.Contains(strings.ToLower(name), "password") {
			secrets = append(secrets, vs...)
		}
	}
	return RedactSecrets(msg, secrets...)
}

// RedactSecrets returns msg with each secret, as written, query-escaped,
// path-escaped and escaped as a URL's userinfo (as url.URL.String writes a
// password), replaced by "xxxxx". Empty secrets are ignored.
func RedactSecrets(msg string, secrets ...string) string {
	for _, s := range secrets {
		if s == "" {
			continue
		}
		userinfo := strings.TrimPrefix(url.UserPassword("", s).String(), ":")
		for _, form := range []string{s, url.QueryEscape(s), url.PathEscape(s), userinfo} {
			msg = strings.ReplaceAll(msg, form, "xxxxx")
		}
	}
	return msg
}

// RedactedError returns an error whose message is msg (already redacted)
// and which wraps err, so that errors.Is and errors.As still find what err
// wraps (a context's error, a network error) while its text, which may
// quote a password, is never shown.
func RedactedError(msg string, err error) error { return redactedError{msg, err} }

type redactedError struct {
	msg string
	err error
}

func (e redactedError) Error() string { return e.msg }
func (e redactedError) Unwrap() error { return e.err }

// Register registers open with locker.Register under every scheme given.
// open may return the backend's own Locker type: a failed open is returned
// as a nil locker.Locker, never as an interface holding a nil pointer.
func Register[L locker.Locker](open func(context.Context, *url.URL) (L, error), schemes ...string) {
	opener := func(ctx context.Context, u *url.URL) (locker.Locker, error) {
		l, err := open(ctx, u)
		if err != nil {
			return nil, err
		}
		return l, nil
	}
	for _, s := range schemes {
		locker.Register(s, opener)
	}
}
