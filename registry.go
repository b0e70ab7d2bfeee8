package locker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
)

// Opener opens a Locker from a URL whose scheme it was registered for. It
// must reject query parameters it does not know with an error wrapping
// ErrInvalidURL, and must not mention the URL's password in any error.
type Opener func(ctx context.Context, u *url.URL) (Locker, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]Opener{}
)

// Register makes a backend available to Open under scheme (case-insensitive).
// Backends call it from init. It panics when opener is nil, the scheme is
// empty, or the scheme is registered twice: all are programming errors.
func Register(scheme string, opener Opener) {
	scheme = strings.ToLower(scheme)
	if scheme == "" {
		panic("locker: Register with an empty scheme")
	}
	if opener == nil {
		panic(fmt.Sprintf("locker: Register of scheme %q with a nil opener", scheme))
	}
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[scheme]; dup {
		panic(fmt.Sprintf("locker: Register called twice for scheme %q", scheme))
	}
	registry[scheme] = opener
}

// Schemes returns the registered URL schemes, sorted.
func Schemes() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	out := make([]string, 0, len(registry))
	for s := range registry {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// Open returns a Locker for rawURL, chosen by its scheme ("redis://...",
// "postgres://...", "mem://", ...). The backend's package must be imported,
// usually for its side effects:
//
//	import _ "github.com/go-locker/locker/redis"
//
// The Locker owns the clients it opened and closes them in Close.
func Open(ctx context.Context, rawURL string) (Locker, error) {
	if hostPortOnly(rawURL) {
		return nil, fmt.Errorf("%w: %q is a host and port without a scheme; write a URL such as redis://%s or postgres://user@%s/db", ErrInvalidURL, redactHostPort(rawURL), redactHostPort(rawURL), redactHostPort(rawURL))
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Parse quotes the whole URL, password included; say less.
		return nil, fmt.Errorf("%w: cannot parse URL: %v", ErrInvalidURL, redactParseError(err))
	}
	if u.Scheme == "" {
		return nil, fmt.Errorf("%w: %q has no scheme (want e.g. redis://host:6379)", ErrInvalidURL, u.Redacted())
	}
	scheme := strings.ToLower(u.Scheme)
	registryMu.RLock()
	opener := registry[scheme]
	registryMu.RUnlock()
	if opener == nil {
		return nil, fmt.Errorf("%w %q (forgotten import?)", ErrUnknownScheme, scheme)
	}
	return opener(ctx, u)
}

// hostPortOnly reports whether raw is "host:port" (perhaps with a path), which
// url.Parse reads as the scheme "host" (or fails on, for an IP address), so
// that Open would answer with an unknown scheme or a parse error instead of
// what is wrong.
func hostPortOnly(raw string) bool {
	if strings.Contains(raw, "://") {
		return false
	}
	hp, _, _ := strings.Cut(raw, "/")
	host, port, err := net.SplitHostPort(hp)
	if err != nil || host == "" || port == "" || strings.ContainsAny(host, "@?#") {
		return false
	}
	for _, c := range port {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// redactHostPort is the host:port part of a raw string that hostPortOnly
// accepted (it has no user info to hide, but no path or query is echoed).
func redactHostPort(raw string) string {
	hp, _, _ := strings.Cut(raw, "/")
	return hp
}

// redactParseError returns what url.Parse said without the URL, and without
// the fragment of it that net/url quotes in some messages: a password with
// an unescaped '/', '?' or '#' ends the host early, and the rest of the
// password then shows up as an "invalid port".
func redactParseError(err error) error {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err
	}
	msg := ue.Err.Error()
	if i, j := strings.IndexByte(msg, '"'), strings.LastIndexByte(msg, '"'); i >= 0 && j > i {
		msg = msg[:i] + "…" + msg[j+1:]
	}
	if strings.Contains(msg, "port") || strings.Contains(msg, "userinfo") {
		msg += " (percent-encode any '/', '?', '#' or '@' in the user name or password)"
	}
	return errors.New(msg)
}
