package etcd

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/backend/tlsurl"
)

// Schemes the package registers with locker.Register: etcd (plain) and
// etcds (TLS, verified against the system roots).
const (
	Scheme    = "etcd"
	SchemeTLS = "etcds"
)

// URL query parameters.
const (
	paramDialTimeout = "dial_timeout" // clientv3.Config.DialTimeout
)

// defaultDialTimeout bounds the login of a client Open makes with a user
// and password (clientv3.Config.DialTimeout).
const defaultDialTimeout = 5 * time.Second

func init() { backend.Register(openURL, Scheme, SchemeTLS) }

// Open returns a Locker for an etcd:// or etcds:// URL (see the package
// documentation) on a client of its own, which Close closes. It is what
// locker.Open calls, exported for callers that want the concrete type.
func Open(ctx context.Context, rawURL string) (*Locker, error) {
	u, err := backend.ParseURL("etcd", rawURL)
	if err != nil {
		if herr := hostListError(rawURL); herr != nil {
			return nil, herr
		}
		return nil, err
	}
	return openURL(ctx, u)
}

// hostListError says what is wrong with a host list that url.Parse
// rejected, or returns nil when the list is not the problem. url.Parse
// takes the text after the last ':' of the whole list as the port, so the
// last host must carry one, and a bad port anywhere makes the URL fail to
// parse (with a hint about percent-encoding passwords that does not apply).
// Nothing of the URL is quoted: a password with an unescaped '/' would
// shift the split.
func hostListError(raw string) error {
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		rest = rest[i+1:]
	}
	if !strings.Contains(rest, ",") {
		return nil
	}
	hosts := strings.Split(rest, ",")
	last := hosts[len(hosts)-1]
	if _, _, err := net.SplitHostPort(last); err != nil {
		return fmt.Errorf("%w: etcd: the last host of a host list has no port: it must carry one (etcd://h1:2379,h2:2379; the others default to 2379), because url.Parse reads what follows the last ':' of the whole list as one port", locker.ErrInvalidURL)
	}
	for _, h := range hosts {
		if _, err := withPort(h); err != nil {
			return fmt.Errorf("%w: etcd: a host of the host list has a bad port (want host[:port], port 1-65535, and a port on the last host)", locker.ErrInvalidURL)
		}
	}
	return nil
}

// urlConfig is a URL, parsed.
type urlConfig struct {
	endpoints   []string
	tls         bool
	tlsConfig   *tls.Config // etcds: from tls_ca, tls_cert, tls_key
	user        string
	password    string
	dialTimeout time.Duration
	opts        []Option
}

func parseURL(u *url.URL) (urlConfig, error) {
	bad := func(format string, args ...any) (urlConfig, error) {
		return urlConfig{}, fmt.Errorf("%w: etcd: "+format, append([]any{locker.ErrInvalidURL}, args...)...)
	}
	var cfg urlConfig
	switch {
	case strings.EqualFold(u.Scheme, Scheme):
	case strings.EqualFold(u.Scheme, SchemeTLS):
		cfg.tls = true
	default:
		return bad("unsupported scheme %q", u.Scheme)
	}
	switch {
	case u.Opaque != "":
		return bad("want etcd://host:port[,host:port...][/prefix]")
	case u.Host == "":
		return bad("no server in the URL")
	case u.Fragment != "":
		return bad("a fragment is not allowed")
	}
	for _, s := range strings.Split(u.Host, ",") {
		a, err := withPort(s)
		if err != nil {
			return bad("%v", err)
		}
		cfg.endpoints = append(cfg.endpoints, a)
	}
	pathPrefix := u.Path != "" && u.Path != "/"
	if pathPrefix {
		if err := checkPrefix(u.Path); err != nil {
			return bad("path (the key prefix): %v", err)
		}
		cfg.opts = append(cfg.opts, WithPrefix(u.Path))
	}
	q, err := backend.ParseQuery(u)
	if err != nil {
		return urlConfig{}, err
	}
	// The shared parameters (backend.Settings): ttl, drift_margin, prefix
	// and token_base set what WithDefaultTTL, WithDriftMargin, WithPrefix
	// and WithTokenBase do;
	// retry_interval and ddl are checked and change nothing here (watches
	// wake waiters; etcd has no schema); watchdog=false is refused.
	for _, set := range q.Shared(map[string]string{backend.ParamWatchdog: "the Locker always keeps its leases alive"}) {
		cfg.opts = append(cfg.opts, sharedOption(set))
	}
	if pathPrefix && q.Has(backend.ParamPrefix) {
		return bad("the key prefix is given twice, as the path and as the parameter prefix: give one")
	}
	cfg.dialTimeout = defaultDialTimeout
	q.Duration(paramDialTimeout, &cfg.dialTimeout)
	if cfg.tlsConfig, err = tlsurl.Config(q, cfg.tls, "etcds://"); err != nil {
		return urlConfig{}, err
	}
	if err := q.Finish(); err != nil {
		return urlConfig{}, err
	}
	if u.User != nil {
		cfg.user = u.User.Username()
		cfg.password, _ = u.User.Password()
		switch {
		case cfg.user == "":
			return bad("user information without a user name")
		case cfg.password == "":
			// clientv3 logs in only when both are set: the client would
			// connect without authentication, silently.
			return bad("user %q has no password (etcd's client would connect without authentication); write user:password@", cfg.user)
		}
	}
	if c := newConfig(cfg.opts); c.err != nil {
		return bad("%v", c.err)
	}
	return cfg, nil
}

func withPort(s string) (string, error) { return backend.HostPort(s, "2379") }

// sharedOption is the Option of a shared setting read from a URL: through
// the With function of the same name, which checks etcd's own range.
func sharedOption(set backend.Setting) Option {
	return func(c *config) error {
		var s backend.Settings
		if err := set(&s); err != nil {
			return fmt.Errorf("etcd: %w", err)
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
		return nil // retry_interval, ddl: no effect on etcd
	}
}

func openURL(ctx context.Context, u *url.URL) (*Locker, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	cc := clientConfig(ctx, cfg)
	var diag *connDiag
	if cfg.tls {
		diag = &connDiag{}
		cc.DialOptions = append(cc.DialOptions, grpc.WithTransportCredentials(newDiagCreds(cfg.tlsConfig, diag)))
	}
	redact := func(err error) error {
		if cerr := diag.err(); cerr != nil {
			err = fmt.Errorf("%w (the latest connection failed: %v)", err, cerr)
		}
		msg := backend.RedactSecrets(err.Error(), cfg.password)
		return backend.RedactedError("etcd: connecting to "+strings.Join(cfg.endpoints, ",")+": "+msg, err)
	}
	// The client connects in the background, as the redis and postgres
	// Openers' pools do: Open contacts no server, and an unreachable one
	// shows in the first call. Only a user and password make clientv3.New
	// log in at once (bounded by dial_timeout); its error is Open's.
	cli, err := clientv3.New(cc)
	if err != nil {
		return nil, redact(err)
	}
	l := New(cli, cfg.opts...)
	l.owns, l.diag = true, diag
	return l, nil
}

// Keepalive of the gRPC connections of a client Open makes: a connection
// to a member that stopped answering (hung, paused, cut off) is dropped
// after about keepAliveTime+keepAliveTimeout, and the client's calls go to
// the other members. etcd refuses pings more often than every 5s
// (--grpc-keepalive-min-time).
const (
	keepAliveTime    = 10 * time.Second
	keepAliveTimeout = 5 * time.Second
)

// clientConfig is the etcd client configuration of a parsed URL.
func clientConfig(ctx context.Context, cfg urlConfig) clientv3.Config {
	cc := clientv3.Config{
		Endpoints:            make([]string, len(cfg.endpoints)),
		DialTimeout:          cfg.dialTimeout,
		DialKeepAliveTime:    keepAliveTime,
		DialKeepAliveTimeout: keepAliveTimeout,
		Username:             cfg.user,
		Password:             cfg.password,
		Context:              context.WithoutCancel(ctx),
		Logger:               quietLogger(),
	}
	if cfg.tls {
		cc.TLS = cfg.tlsConfig
	}
	for i, e := range cfg.endpoints {
		if cfg.tls {
			cc.Endpoints[i] = "https://" + e
		} else {
			cc.Endpoints[i] = "http://" + e
		}
	}
	return cc
}
