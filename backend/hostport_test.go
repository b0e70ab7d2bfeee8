package backend

import (
	"strings"
	"testing"
)

func TestHostPort(t *testing.T) {
	ok := map[string]string{
		"h":           "h:2379",
		"h:1234":      "h:1234",
		"[::1]:1234":  "[::1]:1234",
		"[::1]":       "[::1]:2379",
		"::1":         "[::1]:2379",
		"10.0.0.1":    "10.0.0.1:2379",
		"10.0.0.1:80": "10.0.0.1:80",
	}
	for in, want := range ok {
		if got, err := HostPort(in, "2379"); err != nil || got != want {
			t.Errorf("HostPort(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "h:0", "h:65536", "h:x", ":80", "h:", "[h]", "[10.0.0.1]", "[::1", "a:b:c", "[[::1]]"} {
		_, err := HostPort(in, "2379")
		if err == nil {
			t.Errorf("HostPort(%q) accepted", in)
		} else if in != "" && !strings.Contains(err.Error(), in) {
			t.Errorf("HostPort(%q) = %v, which does not quote the address", in, err)
		}
	}
}
