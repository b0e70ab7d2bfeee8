package conformance

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/go-locker/locker"
)

// The Open cases check a backend's URL opener (the Opener it registers with
// locker.Register) on Harness.URL.

// secretPassword is put into URLs; no error may contain it.
const secretPassword = "c0nf0rmance-s3cret"

func (s *suite) needURL(t *testing.T) *url.URL {
	t.Helper()
	if s.h.URL == "" {
		t.Skip("conformance: Harness.URL is not set; set it to check the backend's URL opener")
	}
	u, err := url.Parse(s.h.URL)
	if err != nil {
		t.Fatalf("conformance: Harness.URL does not parse: %v", err)
	}
	return u
}

// openWorks: Harness.URL opens a Locker that takes and releases a lock.
func (s *suite) openWorks(t *testing.T, ctx context.Context) {
	u := s.needURL(t)
	l, err := locker.Open(ctx, u.String())
	if err != nil {
		t.Fatalf("locker.Open(Harness.URL): %v", redactErr(err, u))
	}
	defer l.Close()
	mustRelease(t, ctx, mustTry(t, ctx, l, key(t, "")))
}

// openRejectsUnknown: an unknown query parameter, a misspelt option, is
// rejected with ErrInvalidURL and named in the error, instead of being
// ignored or passed on to the server.
func (s *suite) openRejectsUnknown(t *testing.T, ctx context.Context) {
	u := s.needURL(t)
	q := u.Query()
	q.Set("conformance_unknown_option", "1")
	u.RawQuery = q.Encode()
	l, err := locker.Open(ctx, u.String())
	if err == nil {
		_ = l.Close()
		t.Fatalf("locker.Open with an unknown query parameter succeeded; a misspelt option must be an error, not ignored")
	}
	if !errors.Is(err, locker.ErrInvalidURL) {
		t.Errorf("locker.Open with an unknown query parameter: %v, want an error wrapping locker.ErrInvalidURL", redactErr(err, u))
	}
	if !strings.Contains(err.Error(), "conformance_unknown_option") {
		t.Errorf("locker.Open with an unknown query parameter: %v does not name the parameter", redactErr(err, u))
	}
}

// openHidesPassword: a password in the URL appears in no error of Open,
// whatever else is wrong with the URL.
func (s *suite) openHidesPassword(t *testing.T, ctx context.Context) {
	u := s.needURL(t)
	user := "locker"
	if u.User != nil && u.User.Username() != "" {
		user = u.User.Username()
	}
	for _, c := range []struct {
		name  string
		build func(u url.URL) string
	}{
		{"unknown parameter", func(u url.URL) string {
			q := u.Query()
			q.Set("conformance_unknown_option", "1")
			u.RawQuery = q.Encode()
			return u.String()
		}},
		{"malformed query", func(u url.URL) string { u.RawQuery += "&%zz"; return u.String() }},
		{"bad port", func(u url.URL) string {
			u.Host = u.Hostname() + ":99999999"
			return u.String()
		}},
		{"unescaped slash in the password", func(u url.URL) string {
			raw := u.String()
			return strings.Replace(raw, secretPassword, secretPassword[:4]+"/"+secretPassword[4:], 1)
		}},
	} {
		v := *u
		v.User = url.UserPassword(user, secretPassword)
		raw := c.build(v)
		l, err := locker.Open(ctx, raw)
		if err == nil {
			_ = l.Close()
			continue
		}
		msg := err.Error()
		for _, part := range []string{secretPassword, secretPassword[:4], secretPassword[4:]} {
			if strings.Contains(msg, part) {
				t.Errorf("locker.Open with a %s: the error echoes (part of) the password: %s", c.name, strings.ReplaceAll(msg, part, "<password>"))
				break
			}
		}
	}
}

// redactErr is err with Harness.URL's own password hidden, for messages.
func redactErr(err error, u *url.URL) string {
	msg := err.Error()
	if p, ok := u.User.Password(); ok && p != "" {
		msg = strings.ReplaceAll(msg, p, "xxxxx")
	}
	return msg
}
