package cli

import (
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

func TestOwnerDescription(t *testing.T) {
	cmd := []string{"sh", "-c", "echo 'hi'\n\tthere"}
	d := ownerDescription(cmd)
	if _, err := backend.ApplyOptions(locker.WithOwner(d)); err != nil {
		t.Fatalf("ownerDescription(%q) = %q, which WithOwner refuses: %v", cmd, d, err)
	}
	h := parseOwner(d)
	host, _ := os.Hostname()
	if !h.ours || h.host != host || h.pid != os.Getpid() || h.start.Unix() != started.Unix() || h.cmd != `sh -c 'echo '\''hi'\''  there'` {
		t.Errorf("parseOwner(%q) = %+v", d, h)
	}

	long := ownerDescription([]string{strings.Repeat("é", 400)})
	if len(long) > locker.MaxOwnerLen || !utf8.ValidString(long) {
		t.Errorf("a long command's description is %d bytes (valid UTF-8: %v), want at most %d", len(long), utf8.ValidString(long), locker.MaxOwnerLen)
	}

	// Cut short (PostgreSQL), and a program's own description.
	if h := parseOwner("host=a pid=12 start=17"); !h.ours || h.host != "a" || h.pid != 12 || h.start.Unix() != 17 || h.cmd != "" {
		t.Errorf("parseOwner of a cut description = %+v", h)
	}
	if h := parseOwner("worker 7 of billing"); h.ours || h.foreign != "worker 7 of billing" {
		t.Errorf("parseOwner of a program's description = %+v", h)
	}
}
