package backend

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

func parse(t *testing.T, raw string) *Query {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q, err := ParseQuery(u)
	if err != nil {
		t.Fatalf("ParseQuery(%q): %v", raw, err)
	}
	return q
}

func TestGetters(t *testing.T) {
	q := parse(t, "x://h?ttl=1500ms&on=true&n=7&name=a%20b&flag")
	var (
		ttl  time.Duration
		on   bool
		n    int
		name string
	)
	q.Duration("ttl", &ttl)
	q.Bool("on", &on)
	q.Int("n", &n, 1, 10)
	q.String("name", &name)
	if !q.Has("flag") || q.Has("absent") {
		t.Error("Has is wrong")
	}
	if err := q.Finish(); err != nil {
		t.Fatal(err)
	}
	if ttl != 1500*time.Millisecond || !on || n != 7 || name != "a b" {
		t.Fatalf("got ttl=%v on=%v n=%v name=%q", ttl, on, n, name)
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		query string
		read  func(q *Query)
		want  string // in the message
	}{
		{"ttl=0s", func(q *Query) { var d time.Duration; q.Duration("ttl", &d) }, `"ttl": must be positive`},
		{"ttl=-1s", func(q *Query) { var d time.Duration; q.Duration("ttl", &d) }, `"ttl": must be positive`},
		{"ttl=5", func(q *Query) { var d time.Duration; q.Duration("ttl", &d) }, `"5" is not a duration`},
		{"ttl=1s&ttl=2s", func(q *Query) { var d time.Duration; q.Duration("ttl", &d) }, "given 2 times"},
		{"on=yes", func(q *Query) { var b bool; q.Bool("on", &b) }, `"yes" is not true or false`},
		{"n=11", func(q *Query) { var n int; q.Int("n", &n, 1, 10) }, "from 1 to 10"},
		{"n=x", func(q *Query) { var n int; q.Int("n", &n, 1, 10) }, "from 1 to 10"},
		{"ttl=1s&bogus=1&Other=2", func(q *Query) { var d time.Duration; q.Duration("ttl", &d) }, "unknown parameter(s) Other, bogus (known: ttl)"},
		{"TTL=1s", func(q *Query) { var d time.Duration; q.Duration("ttl", &d) }, "unknown parameter(s) TTL"},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			q := parse(t, "x://h?"+tt.query)
			tt.read(q)
			err := q.Finish()
			if !errors.Is(err, locker.ErrInvalidURL) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Finish() = %v, want ErrInvalidURL saying %q", err, tt.want)
			}
		})
	}
}

func TestMalformedQuery(t *testing.T) {
	u := &url.URL{Scheme: "x", Host: "h", RawQuery: "a=%zz"}
	if _, err := ParseQuery(u); !errors.Is(err, locker.ErrInvalidURL) {
		t.Fatalf("New = %v, want ErrInvalidURL", err)
	}
}

func TestRestKeepsUnknown(t *testing.T) {
	q := parse(t, "x://h?ttl=1s&pool_size=3&pool_size=4")
	var d time.Duration
	q.Duration("ttl", &d)
	rest := q.Rest()
	if len(rest) != 1 || len(rest["pool_size"]) != 2 {
		t.Fatalf("Rest() = %v, want pool_size twice", rest)
	}
	if err := q.Err(); err != nil {
		t.Fatalf("Err() = %v", err)
	}
}
