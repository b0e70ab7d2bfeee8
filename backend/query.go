package backend

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-locker/locker"
)

// Query reads parameters from a URL's query. Each getter records the first
// error; Finish reports it, or any parameter no getter asked for.
type Query struct {
	scheme string
	vals   url.Values
	used   map[string]bool
	errs   []error
}

// ParseQuery returns a Query over u's query string, or an error wrapping
// locker.ErrInvalidURL when the query is malformed.
func ParseQuery(u *url.URL) (*Query, error) {
	vals, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: malformed query: %v", locker.ErrInvalidURL, u.Scheme, err)
	}
	return &Query{scheme: u.Scheme, vals: vals, used: map[string]bool{}}, nil
}

// Scheme is the URL's scheme, for errors that name it.
func (q *Query) Scheme() string { return q.scheme }

func (q *Query) get(name string) (string, bool) {
	q.used[name] = true
	vs, ok := q.vals[name]
	if !ok {
		return "", false
	}
	if len(vs) != 1 {
		q.fail(name, "given %d times", len(vs))
		return "", false
	}
	return vs[0], true
}

func (q *Query) fail(name, format string, args ...any) {
	q.errs = append(q.errs, fmt.Errorf("%w: %s: parameter %q: %s", locker.ErrInvalidURL, q.scheme, name, fmt.Sprintf(format, args...)))
}

// Has reports whether name was given (and marks it known).
func (q *Query) Has(name string) bool {
	q.used[name] = true
	_, ok := q.vals[name]
	return ok
}

// String sets *dst to the parameter's value when given.
func (q *Query) String(name string, dst *string) {
	if v, ok := q.get(name); ok {
		*dst = v
	}
}

// Take marks name as known and returns its value and whether it was given.
func (q *Query) Take(name string) (string, bool) {
	return q.get(name)
}

// Duration sets *dst from a Go duration ("1.5s", "300ms"); it must be positive.
func (q *Query) Duration(name string, dst *time.Duration) {
	v, ok := q.get(name)
	if !ok {
		return
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		q.fail(name, "%q is not a duration such as 30s or 500ms", v)
		return
	}
	if d <= 0 {
		q.fail(name, "must be positive, got %v", d)
		return
	}
	*dst = d
}

// Bool sets *dst from true/false/1/0.
func (q *Query) Bool(name string, dst *bool) {
	v, ok := q.get(name)
	if !ok {
		return
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		q.fail(name, "%q is not true or false", v)
		return
	}
	*dst = b
}

// Int sets *dst from a decimal integer within [min, max].
func (q *Query) Int(name string, dst *int, min, max int) {
	v, ok := q.get(name)
	if !ok {
		return
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < min || n > max {
		q.fail(name, "%q is not an integer from %d to %d", v, min, max)
		return
	}
	*dst = n
}

// Finish returns the first malformed parameter, or the unknown ones.
func (q *Query) Finish() error {
	var unknown []string
	for name := range q.vals {
		if !q.used[name] {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		known := make([]string, 0, len(q.used))
		for name := range q.used {
			known = append(known, name)
		}
		slices.Sort(known)
		q.errs = append(q.errs, fmt.Errorf("%w: %s: unknown parameter(s) %s (known: %s)",
			locker.ErrInvalidURL, q.scheme, strings.Join(unknown, ", "), strings.Join(known, ", ")))
	}
	return errors.Join(q.errs...)
}

// Rest returns the parameters no getter asked for, for handing to a client
// library that parses its own; call it instead of Finish in that case.
func (q *Query) Rest() url.Values {
	rest := url.Values{}
	for name, vs := range q.vals {
		if !q.used[name] {
			rest[name] = vs
		}
	}
	return rest
}

// Err returns the errors recorded so far, ignoring unknown parameters.
func (q *Query) Err() error { return errors.Join(q.errs...) }
