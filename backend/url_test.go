package backend

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/go-locker/locker"
)

func TestParseURLHidesPassword(t *testing.T) {
	const secret = "pa55word"
	for _, raw := range []string{
		"x://user:" + secret + "@host:port",                   // bad port
		"x://user:" + secret[:3] + "/" + secret[3:] + "@host", // an unescaped '/' ends the host early
		"x://user:" + secret + "%zz@host",                     // bad escape
		"x://user:" + secret + "@[::1",                        // bad host
	} {
		u, err := ParseURL("x", raw)
		if err == nil {
			t.Errorf("ParseURL(%q) = %v, want an error", strings.ReplaceAll(raw, secret, "…"), u)
			continue
		}
		if !errors.Is(err, locker.ErrInvalidURL) {
			t.Errorf("ParseURL: %v, want an error wrapping locker.ErrInvalidURL", err)
		}
		for _, part := range []string{secret, secret[:3] + "/", secret[3:] + "@"} {
			if strings.Contains(err.Error(), part) {
				t.Errorf("ParseURL error shows (part of) the password: %s", strings.ReplaceAll(err.Error(), part, "<pw>"))
			}
		}
		if !strings.HasPrefix(err.Error(), "locker: invalid URL: x: ") {
			t.Errorf("ParseURL error %q does not name the backend", err)
		}
	}
	if u, err := ParseURL("x", "x://user:"+secret+"@host:1/p"); err != nil || u.Host != "host:1" {
		t.Errorf("ParseURL of a good URL = %v, %v", u, err)
	}
}

func TestRedact(t *testing.T) {
	u, err := url.Parse("redis://user:p%40ss%2Fw@host:6379/0?sentinel_password=s3cret&x=1")
	if err != nil {
		t.Fatal(err)
	}
	msg := "dial user:p@ss/w and p%40ss%2Fw and p%40ss/w and s3cret; x=1"
	got := Redact(msg, u)
	for _, leak := range []string{"p@ss", "s3cret"} {
		if strings.Contains(got, leak) {
			t.Errorf("Redact left %q in %q", leak, got)
		}
	}
	if !strings.Contains(got, "x=1") || !strings.Contains(got, "user") {
		t.Errorf("Redact removed more than the secrets: %q", got)
	}
	// url.URL.String escapes a password in userinfo its own way: "s3+cr@t"
	// becomes "s3+cr%40t", which neither query nor path escaping gives.
	pu := &url.URL{Scheme: "redis", User: url.UserPassword("u", "s3+cr@t;x"), Host: "h1:abc"}
	if got := Redact(`parse "`+pu.String()+`": invalid port`, pu); strings.Contains(got, "s3+cr") {
		t.Errorf("Redact left the userinfo-escaped password in %q", got)
	}
	if got := RedactSecrets("a  b", ""); got != "a  b" {
		t.Errorf("an empty secret changed the message: %q", got)
	}
	cause := context.DeadlineExceeded
	re := RedactedError("etcd: connecting: xxxxx", fmt.Errorf("dial with secret: %w", cause))
	if re.Error() != "etcd: connecting: xxxxx" || !errors.Is(re, context.DeadlineExceeded) {
		t.Errorf("RedactedError = %q, Is(DeadlineExceeded) %v", re, errors.Is(re, context.DeadlineExceeded))
	}
}
