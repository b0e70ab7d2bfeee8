package redis

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/redis/internal/settings"
)

// URL schemes registered with locker.Register; see the package
// documentation for their forms.
const (
	SchemeRedis       = "redis"
	SchemeRedisTLS    = "rediss"
	SchemeCluster     = "redis+cluster"
	SchemeClusterTLS  = "rediss+cluster"
	SchemeSentinel    = "redis+sentinel"
	SchemeSentinelTLS = "rediss+sentinel"
)

func init() {
	for _, s := range []string{SchemeRedis, SchemeRedisTLS, SchemeCluster, SchemeClusterTLS, SchemeSentinel, SchemeSentinelTLS} {
		locker.Register(s, open)
	}
}

// Open returns a Locker for a redis://, rediss://, redis+cluster://,
// rediss+cluster://, redis+sentinel:// or rediss+sentinel:// URL. It is
// what locker.Open calls; it is exported for callers that want the concrete
// type. The Locker owns the client it makes and closes it in Close. Open
// does not contact the server: a wrong address or password shows in the
// first Acquire, as with database/sql.Open.
func Open(ctx context.Context, rawURL string) (*Locker, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Parse quotes the whole URL, password included.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("%w: redis: cannot parse URL: %v", locker.ErrInvalidURL, err)
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
	base, kind, _ := strings.Cut(scheme, "+")
	if base != SchemeRedis && base != SchemeRedisTLS || kind != "" && kind != "cluster" && kind != "sentinel" {
		return nil, fmt.Errorf("%w: redis: unsupported scheme %q", locker.ErrInvalidURL, scheme)
	}
	q, err := backend.ParseQuery(u)
	if err != nil {
		return nil, err
	}
	var opts []Option
	for _, set := range q.Shared(nil) {
		opts = append(opts, func(c *config) error { return c.Set(set) })
	}
	var (
		clock     bool
		fenceIdle time.Duration
		eviction  bool
	)
	q.Bool("clock_tokens", &clock)
	q.Duration("fence_expiry", &fenceIdle)
	q.Bool("allow_eviction", &eviction)
	var (
		acks       int
		ackTimeout time.Duration
	)
	q.Int("replica_ack", &acks, 0, MaxReplicaAck)
	q.Duration("replica_ack_timeout", &ackTimeout)
	if err := q.Err(); err != nil {
		return nil, err
	}
	opts = append(opts, WithClockTokens(clock), WithAllowEviction(eviction))
	switch {
	case acks > 0:
		if ackTimeout == 0 {
			ackTimeout = DefaultReplicaAckTimeout
		}
		opts = append(opts, WithReplicaAck(acks, ackTimeout))
	case ackTimeout > 0:
		return nil, fmt.Errorf("%w: %s: parameter \"replica_ack_timeout\" needs replica_ack", locker.ErrInvalidURL, scheme)
	}
	if fenceIdle > 0 {
		opts = append(opts, WithFenceExpiry(fenceIdle))
	}
	// Check our options before making a client that would need closing.
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", locker.ErrInvalidURL, err)
	}

	// Hand the rest to go-redis' own parser, which rejects what it does not
	// know. It only understands redis:// and rediss://.
	rest := q.Rest()
	gu := *u
	gu.Scheme = base
	gu.RawQuery = rest.Encode()
	var client goredis.UniversalClient
	switch kind {
	case "":
		o, err := goredis.ParseURL(gu.String())
		if err != nil {
			return nil, settings.ClientURLError(scheme, u, err)
		}
		settings.DefaultContextTimeout(&o.ContextTimeoutEnabled, rest)
		client = goredis.NewClient(o)
	case "cluster":
		o, err := goredis.ParseClusterURL(gu.String())
		if err != nil {
			return nil, settings.ClientURLError(scheme, u, err)
		}
		settings.DefaultContextTimeout(&o.ContextTimeoutEnabled, rest)
		client = goredis.NewClusterClient(o)
	case "sentinel":
		o, err := goredis.ParseFailoverURL(gu.String())
		if err != nil {
			return nil, settings.ClientURLError(scheme, u, err)
		}
		if o.MasterName == "" {
			return nil, fmt.Errorf("%w: %s: parameter \"master_name\" is required", locker.ErrInvalidURL, scheme)
		}
		settings.DefaultContextTimeout(&o.ContextTimeoutEnabled, rest)
		client = goredis.NewFailoverClient(o)
	}
	if err := cfg.checkAck(client); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("%w: %w", locker.ErrInvalidURL, err)
	}
	l := New(client, opts...)
	l.ownClient = true
	return l, nil
}
