package cli

import (
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-locker/locker"
)

// The holder's description that run and hold give with locker.WithOwner,
// for status (and anyone inspecting the lock):
//
//	host=<hostname> pid=<locker's pid> start=<unix seconds> cmd=<command line>
//
// start is when the locker process started. The command comes last, so a
// backend that keeps only the start of a description (PostgreSQL) cuts the
// command, not who holds the lock. Control characters in the command
// become spaces, and the whole is cut to locker.MaxOwnerLen bytes.

// started is when this locker process started (near enough: package init).
var started = time.Now()

// ownerFlag is --owner: a description given by hand, checked as
// locker.WithOwner checks it.
type ownerFlag struct {
	s   string
	set bool
	err error
}

func (f *ownerFlag) String() string { return f.s }
func (f *ownerFlag) Type() string   { return "TEXT" }
func (f *ownerFlag) Set(s string) error {
	var o locker.Options
	f.s, f.set, f.err = s, true, locker.WithOwner(s)(&o)
	return nil // check() reports err with the others, as a usage error
}

// description is the holder's description for a lock taken for the
// command line cmd: --owner's if given, else ownerDescription's.
func (o lockOpts) description(cmd []string) string {
	if o.ownerFlag.set {
		return o.ownerFlag.s
	}
	return ownerDescription(cmd)
}

// ownerDescription is the description of this process holding a lock for
// the command line cmd.
func ownerDescription(cmd []string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "?"
	}
	s := "host=" + clean(strings.ReplaceAll(host, " ", "_")) +
		" pid=" + strconv.Itoa(os.Getpid()) +
		" start=" + strconv.FormatInt(started.Unix(), 10) +
		" cmd=" + clean(shellJoin(cmd))
	return cutUTF8(s, locker.MaxOwnerLen)
}

// shellJoin renders argv as a shell would read it back, near enough for a
// person: arguments with spaces or quotes are single-quoted.
func shellJoin(argv []string) string {
	parts := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && !strings.ContainsAny(a, " \t\n'\"\\$`*?;&|<>()") {
			parts[i] = a
			continue
		}
		parts[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(parts, " ")
}

// clean replaces what locker.WithOwner refuses (control characters,
// invalid UTF-8) with spaces.
func clean(s string) string {
	s = strings.ToValidUTF8(s, " ")
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}

// cutUTF8 cuts s to at most n bytes without splitting a character.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// holder is what status shows of an Inspect's Owner: the fields of the
// description above, or, for a description of another form (a program's
// own locker.WithOwner), the text alone.
type holder struct {
	host    string
	pid     int
	start   time.Time // zero when unknown
	cmd     string
	ours    bool   // the description had the form above
	foreign string // the description, when not ours
}

// parseOwner reads an Owner. A description cut short (PostgreSQL keeps its
// first 50 bytes or so) keeps the fields it has.
func parseOwner(s string) holder {
	rest, ok := strings.CutPrefix(s, "host=")
	if !ok {
		return holder{foreign: s}
	}
	var h holder
	h.ours = true
	h.host, rest, _ = strings.Cut(rest, " pid=")
	var pid, start string
	pid, rest, _ = strings.Cut(rest, " start=")
	h.pid, _ = strconv.Atoi(pid)
	start, h.cmd, _ = strings.Cut(rest, " cmd=")
	if sec, err := strconv.ParseInt(start, 10, 64); err == nil && sec > 0 {
		h.start = time.Unix(sec, 0)
	}
	return h
}
