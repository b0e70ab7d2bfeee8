package zookeeper

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/backend/tlsurl"
)

// Schemes the package registers with locker.Register: zookeeper (plain)
// and zookeeper+tls (TLS to the servers' secure client port, verified
// against the system's roots or tls_ca).
const (
	Scheme    = "zookeeper"
	SchemeTLS = "zookeeper+tls"
)

// URL query parameters.
const (
	paramContainers = "containers" // false: WithoutContainers
	paramACL        = "acl"        // open (default) or creator

	// paramSessionTimeout is gone: the sessions' timeouts are the TTLs of
	// the locks (ttl, locker.WithTTL). Refused with a pointer to ttl.
	paramSessionTimeout = "session_timeout"
)

func init() { backend.Register(openURL, Scheme, SchemeTLS) }

// Open returns a Locker for a zookeeper:// URL (see the package
// documentation), connected as Connect does; it owns its connection. It is
// what locker.Open calls, exported for callers that want the concrete type.
func Open(ctx context.Context, rawURL string) (*Locker, error) {
	u, err := backend.ParseURL("zookeeper", rawURL)
	if err != nil {
		return nil, err
	}
	return openURL(ctx, u)
}

// config of a URL, parsed.
type urlConfig struct {
	servers []string
	opts    []Option
}

func parseURL(u *url.URL) (urlConfig, error) {
	bad := func(format string, args ...any) (urlConfig, error) {
		return urlConfig{}, fmt.Errorf("%w: zookeeper: "+format, append([]any{locker.ErrInvalidURL}, args...)...)
	}
	secure := strings.EqualFold(u.Scheme, SchemeTLS)
	switch {
	case !strings.EqualFold(u.Scheme, Scheme) && !secure:
		return bad("unsupported scheme %q", u.Scheme)
	case u.Opaque != "":
		return bad("want zookeeper://host:port[,host:port...][/root]")
	case u.Host == "":
		return bad("no server in the URL")
	case u.Fragment != "":
		return bad("a fragment is not allowed")
	}
	var cfg urlConfig
	for _, s := range strings.Split(u.Host, ",") {
		a, err := withPort(s)
		if err != nil {
			return bad("%v", err)
		}
		cfg.servers = append(cfg.servers, a)
	}
	if strings.Contains(strings.ToLower(u.EscapedPath()), "%2f") {
		// Decoded, it would name a different, deeper root.
		return bad("path (the lock root) %q has an escaped '/' (%%2F); a ZooKeeper path component cannot contain '/'", u.EscapedPath())
	}
	pathPrefix := u.Path != "" && u.Path != "/"
	if pathPrefix {
		if err := checkRoot(u.Path); err != nil {
			return bad("path (the lock root): %v", err)
		}
		cfg.opts = append(cfg.opts, WithPrefix(u.Path))
	}
	q, err := backend.ParseQuery(u)
	if err != nil {
		return urlConfig{}, err
	}
	// The shared parameters (backend.Settings): ttl, drift_margin and
	// prefix set what WithDefaultTTL, WithDriftMargin and WithPrefix do;
	// retry_interval and ddl are checked and change nothing here (watches
	// wake waiters; the root and lock directories are nodes, not schema);
	// watchdog=false is refused.
	for _, set := range q.Shared(map[string]string{backend.ParamWatchdog: "a lock lasts as long as the session, which the client keeps alive"}) {
		cfg.opts = append(cfg.opts, sharedOption(set))
	}
	if pathPrefix && q.Has(backend.ParamPrefix) {
		return bad("the lock root is given twice, as the path and as the parameter prefix: give one")
	}
	if q.Has(paramSessionTimeout) {
		return bad("parameter %q is gone: a lock's lease is its TTL (a session per lease); set the default TTL with %q", paramSessionTimeout, backend.ParamTTL)
	}
	containers := true
	q.Bool(paramContainers, &containers)
	acl := "open"
	q.String(paramACL, &acl)
	tlsCfg, err := tlsurl.Config(q, secure, SchemeTLS+"://")
	if err != nil {
		return urlConfig{}, err
	}
	if err := q.Finish(); err != nil {
		return urlConfig{}, err
	}
	if tlsCfg != nil {
		cfg.opts = append(cfg.opts, WithTLS(tlsCfg))
	}
	if !containers {
		cfg.opts = append(cfg.opts, WithoutContainers())
	}
	var user, password string
	if u.User != nil {
		user = u.User.Username()
		password, _ = u.User.Password()
		if user == "" {
			return bad("user information without a user name")
		}
		cfg.opts = append(cfg.opts, WithAuth("digest", []byte(user+":"+password)))
	}
	switch acl {
	case "open":
	case "creator":
		if u.User == nil {
			return bad("parameter %q: creator needs a user (zookeeper://user:password@host/...)", paramACL)
		}
		cfg.opts = append(cfg.opts, WithACL(zk.AuthACL(zk.PermAll)...))
	default:
		return bad("parameter %q: %q is not open or creator", paramACL, acl)
	}
	if c := newConfig(cfg.opts); c.err != nil {
		return bad("%v", c.err)
	}
	return cfg, nil
}

func openURL(ctx context.Context, u *url.URL) (*Locker, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	l, err := Connect(ctx, cfg.servers, cfg.opts...)
	if err != nil {
		return nil, backend.RedactedError(backend.Redact(err.Error(), u), err)
	}
	return l, nil
}

// sharedOption is the Option of a shared setting read from a URL: through
// the With function of the same name, which checks this package's range.
func sharedOption(set backend.Setting) Option {
	return func(c *config) error {
		var s backend.Settings
		if err := set(&s); err != nil {
			return fmt.Errorf("zookeeper: %w", err)
		}
		switch {
		case s.TTL != 0:
			return WithDefaultTTL(s.TTL)(c)
		case s.DriftMargin != 0:
			return WithDriftMargin(s.DriftMargin)(c)
		case s.Prefix != "":
			return WithPrefix(s.Prefix)(c)
		case s.TokenBase != 0:
			return WithTokenBase(s.TokenBase)(c)
		}
		return nil // retry_interval, ddl: no effect on ZooKeeper
	}
}
