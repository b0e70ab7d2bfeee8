package redlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/redis/internal/settings"
)

// URL schemes registered with locker.Register. They follow the redis
// package's: "rediss" for TLS, "+" for the deployment kind.
const (
	Scheme    = "redlock"
	SchemeTLS = "rediss+redlock"
)

func init() {
	locker.Register(Scheme, open)
	locker.Register(SchemeTLS, open)
}

// Open returns a Locker for a URL of the form
//
//	redlock://[user:password@]host1:6379,host2:6379,host3:6379[/db][?param=value&...]
//	rediss+redlock://...   (TLS to every node)
//
// with one client per node, all with the same user, password, database
// and client settings. A node whose address cannot be written in the host
// list (an IPv6 literal) can be given as addr=[::1]:6379, repeated. The
// parameters are the shared ones (see backend.Settings) ttl
// (WithDefaultTTL), drift_margin, retry_interval, prefix, token_base
// (WithTokenBase) and ddl (no
// effect: Redlock creates no schema; watchdog=false is refused, since
// Redlock always renews), this package's node_timeout (WithNodeTimeout)
// and allow_eviction (WithAllowEviction), and any go-redis client parameter of
// redis:// URLs (dial_timeout, read_timeout, pool_size, ...), except
// skip_verify, which is refused with an error (it would turn certificate
// verification off for every node): for a private CA, build the clients
// with your own tls.Config and call New. A node address must be host,
// host:port or [ipv6]:port; a malformed one is named in the error, the
// password never.
// context_timeout_enabled defaults to true. Open does not contact the
// nodes. The Locker owns its clients and closes them in Close.
func Open(ctx context.Context, rawURL string) (*Locker, error) {
	u, err := backend.ParseURL("redlock", rawURL)
	if err != nil {
		return nil, err
	}
	return openURL(ctx, u)
}

func open(ctx context.Context, u *url.URL) (locker.Locker, error) {
	l, err := openURL(ctx, u)
	if err != nil {
		return nil, err
	}
	return l, nil
}

func openURL(_ context.Context, u *url.URL) (*Locker, error) {
	scheme := strings.ToLower(u.Scheme)
	var base string
	switch scheme {
	case Scheme:
		base = "redis"
	case SchemeTLS:
		base = "rediss"
	default:
		return nil, fmt.Errorf("%w: redlock: unsupported scheme %q (want %s:// or %s://)", locker.ErrInvalidURL, scheme, Scheme, SchemeTLS)
	}
	q, err := backend.ParseQuery(u)
	if err != nil {
		return nil, err
	}
	var opts []Option
	for _, set := range q.Shared(map[string]string{backend.ParamWatchdog: "Redlock always renews its locks (at TTL/3)"}) {
		opts = append(opts, func(c *config) error { return c.Set(set) })
	}
	var (
		nodeTimeout time.Duration
		eviction    bool
	)
	q.Duration("node_timeout", &nodeTimeout)
	q.Bool("allow_eviction", &eviction)
	if err := q.Err(); err != nil {
		return nil, err
	}
	hosts := []string{}
	if u.Host != "" {
		hosts = strings.Split(u.Host, ",")
	}
	rest := q.Rest()
	hosts = append(hosts, rest["addr"]...)
	rest.Del("addr")
	for i, h := range hosts {
		if err := checkHost(h); err != nil {
			return nil, fmt.Errorf("%w: %s: node %d: %w", locker.ErrInvalidURL, scheme, i+1, err)
		}
	}
	if len(hosts) < 3 || len(hosts)%2 == 0 {
		return nil, fmt.Errorf("%w: %s: need an odd number of at least 3 nodes, got %d", locker.ErrInvalidURL, scheme, len(hosts))
	}
	opts = append(opts, WithAllowEviction(eviction))
	if nodeTimeout > 0 {
		opts = append(opts, WithNodeTimeout(nodeTimeout))
	}
	if _, err := newConfig(opts); err != nil {
		return nil, fmt.Errorf("%w: %w", locker.ErrInvalidURL, err)
	}
	if rest.Has("skip_verify") {
		// go-redis would turn certificate verification off for every node.
		return nil, fmt.Errorf("%w: %s: skip_verify is not supported: build the clients with your own tls.Config (RootCAs for a private CA) and call redlock.New", locker.ErrInvalidURL, scheme)
	}
	clients := make([]goredis.UniversalClient, 0, len(hosts))
	conns := newConnSet()
	closeAll := func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}
	for _, h := range hosts {
		gu := url.URL{Scheme: base, User: u.User, Host: h, Path: u.Path, RawQuery: rest.Encode()}
		o, err := goredis.ParseURL(gu.String())
		if err != nil {
			closeAll()
			return nil, settings.ClientURLError(scheme, u, err)
		}
		settings.DefaultContextTimeout(&o.ContextTimeoutEnabled, rest)
		o.Dialer = conns.dialer(goredis.NewDialer(o))
		clients = append(clients, goredis.NewClient(o))
	}
	l := newLocker(clients, opts)
	l.ownClients = true
	l.conns = conns
	if err := l.Err(); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("%w: %w", locker.ErrInvalidURL, err)
	}
	return l, nil
}

// checkHost reports a node address that is not host, host:port,
// [ipv6] or [ipv6]:port with a port in 1..65535, before it is put into a
// URL of its own with the user and password (go-redis' parser would quote
// that whole URL in its error). The address is quoted only when it cannot
// carry userinfo.
func checkHost(h string) error {
	if h == "" {
		return errors.New("empty node address in the host list")
	}
	if strings.ContainsAny(h, "@/?#") {
		return errors.New("a node address may not contain '@', '/', '?' or '#' (want host:port)")
	}
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") || !strings.Contains(h, ":") {
		return nil // no port: go-redis uses 6379
	}
	_, port, err := net.SplitHostPort(h)
	if err != nil {
		return fmt.Errorf("node address %q is not host:port: %w", h, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("node address %q: invalid port %q", h, port)
	}
	return nil
}
