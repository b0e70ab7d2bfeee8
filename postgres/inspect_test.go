package postgres

import (
	"strings"
	"testing"
)

func TestAppNameRoundTrip(t *testing.T) {
	for _, desc := range []string{"", "host=a pid=1 cmd=sh -c 'x'", "100% ünï ✓", "a%2"} {
		app := "locker 42"
		if e := escapeOwner(desc); e != "" {
			app += " " + e
		}
		for _, c := range app {
			if c < ' ' || c > '~' {
				t.Fatalf("escapeOwner(%q) = %q: not printable ASCII", desc, app)
			}
		}
		token, got, ok := parseAppName(app)
		if !ok || token != 42 || got != desc {
			t.Errorf("parseAppName(%q) = %d, %q, %v; want 42, %q", app, token, got, ok, desc)
		}
	}
	// The server shows 63 bytes: a cut escape and a cut character are
	// dropped, never shown half.
	app := "locker 7 " + escapeOwner("cmd="+strings.Repeat("é", 20))
	_, got, ok := parseAppName(app[:63])
	if !ok || !strings.HasPrefix("cmd="+strings.Repeat("é", 20), got) || strings.ContainsRune(got, '\uFFFD') {
		t.Errorf("parseAppName of a cut name = %q, %v; want a whole-character prefix", got, ok)
	}
	for _, app := range []string{"", "psql", "locker", "locker x", "locker -1 a", "lockerX 1"} {
		if _, _, ok := parseAppName(app); ok {
			t.Errorf("parseAppName(%q) ok; want not a holder's name", app)
		}
	}
}
