package backend

import (
	"errors"
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
