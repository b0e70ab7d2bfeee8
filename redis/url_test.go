package redis

import (
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
)

func TestOpenURLOptions(t *testing.T) {
	ctx := testCtx(t)
	l, err := Open(ctx, "redis://127.0.0.1:1/3?prefix=app%3A&ttl=5s&watchdog=false&drift_margin=50ms&retry_interval=250ms&dial_timeout=1s&client_name=x")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.cfg.Prefix != "app:" || l.cfg.TTL != 5*time.Second || !l.cfg.NoWatchdog || l.cfg.DriftMargin != 50*time.Millisecond || l.cfg.RetryInterval != 250*time.Millisecond {
		t.Errorf("config from URL = %+v", l.cfg)
	}
	c := l.client.(*goredis.Client)
	if o := c.Options(); o.DB != 3 || o.DialTimeout != time.Second || o.ClientName != "x" || !o.ContextTimeoutEnabled {
		t.Errorf("client options from URL: db %d dial %v name %q ctx %v", o.DB, o.DialTimeout, o.ClientName, o.ContextTimeoutEnabled)
	}
	if !l.ownClient {
		t.Error("a Locker opened from a URL must own (and close) its client")
	}
	if err := l.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := c.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("client of a URL-opened Locker after Close: Ping = %v, want a closed-client error", err)
	}

	lf, err := Open(ctx, "redis://127.0.0.1:1?clock_tokens=true&fence_expiry=48h&allow_eviction=true")
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if !lf.cfg.clockTokens || lf.cfg.fenceExpiry != 48*time.Hour || !lf.cfg.AllowEviction {
		t.Errorf("config from URL with clock_tokens, fence_expiry and allow_eviction = %+v", lf.cfg)
	}

	lc, err := Open(ctx, "redis+cluster://127.0.0.1:1?addr=127.0.0.1:2&addr=127.0.0.1:3&ttl=2s")
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	if cc, ok := lc.client.(*goredis.ClusterClient); !ok || len(cc.Options().Addrs) != 3 || !lc.sharded {
		t.Errorf("redis+cluster:// made %T", lc.client)
	}
	ls, err := Open(ctx, "redis+sentinel://127.0.0.1:26379?master_name=mymaster&addr=127.0.0.1:26380")
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	if _, ok := ls.client.(*goredis.Client); !ok {
		t.Errorf("redis+sentinel:// made %T", ls.client)
	}
	// Through the registry.
	lr, err := locker.Open(ctx, "rediss://127.0.0.1:1?skip_verify=true")
	if err != nil {
		t.Fatal(err)
	}
	defer lr.Close()
	if c := lr.(*Locker).client.(*goredis.Client); c.Options().TLSConfig == nil {
		t.Error("rediss:// made a client without TLS")
	}
}

func TestOpenURLRejects(t *testing.T) {
	ctx := testCtx(t)
	const secret = "s3cr3t-PW"
	for _, raw := range []string{
		"redis://u:" + secret + "@127.0.0.1:1?bogus=1",
		"redis://u:" + secret + "@127.0.0.1:1?ttl=5",
		"redis://u:" + secret + "@127.0.0.1:1?ttl=10ms",
		"redis://u:" + secret + "@127.0.0.1:1?ttl=1s&drift_margin=600ms",
		"redis://u:" + secret + "@127.0.0.1:1?watchdog=maybe",
		"redis://u:" + secret + "@127.0.0.1:1?fence_expiry=24h",
		"redis://u:" + secret + "@127.0.0.1:1?clock_tokens=true&fence_expiry=1s",
		"redis://u:" + secret + "@127.0.0.1:1?allow_eviction=sometimes",
		"redis://u:" + secret + "@127.0.0.1:1?prefix=a&prefix=b",
		"redis://u:" + secret + "@127.0.0.1:1/notadb",
		"redis://u:" + secret + "@127.0.0.1:1?dial_timeout=forever",
		"redis+sentinel://u:" + secret + "@127.0.0.1:1",
		"redis+sentinel://127.0.0.1:1?master_name=m&password=" + secret + "&bogus=1",
		"redis+nonsense://127.0.0.1:1",
	} {
		l, err := locker.Open(ctx, raw)
		if err == nil {
			_ = l.Close()
			t.Errorf("Open(%q) succeeded", redact(raw, secret))
			continue
		}
		if !errors.Is(err, locker.ErrInvalidURL) && !errors.Is(err, locker.ErrUnknownScheme) {
			t.Errorf("Open(%q): %v, want an error wrapping ErrInvalidURL", redact(raw, secret), err)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%q): error shows the password: %v", redact(raw, secret), err)
		}
		if strings.Contains(err.Error(), "redis: redis:") {
			t.Errorf("Open(%q): %v says redis: twice", redact(raw, secret), err)
		}
	}
}

func redact(s, secret string) string { return strings.ReplaceAll(s, secret, "xxxxx") }

func TestOpenURLReplicaAck(t *testing.T) {
	ctx := testCtx(t)
	l, err := Open(ctx, "redis+sentinel://127.0.0.1:1?master_name=m&replica_ack=2&replica_ack_timeout=250ms")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.cfg.replicas != 2 || l.cfg.ackTimeout != 250*time.Millisecond {
		t.Errorf("replica_ack from URL: %d, %v", l.cfg.replicas, l.cfg.ackTimeout)
	}
	ld, err := Open(ctx, "redis://127.0.0.1:1?replica_ack=1")
	if err != nil {
		t.Fatal(err)
	}
	defer ld.Close()
	if ld.cfg.replicas != 1 || ld.cfg.ackTimeout != DefaultReplicaAckTimeout {
		t.Errorf("replica_ack without a timeout: %d, %v", ld.cfg.replicas, ld.cfg.ackTimeout)
	}
	for _, tc := range []struct{ url, want string }{
		{"redis://127.0.0.1:1?replica_ack=-1", `"replica_ack"`},
		{"redis://127.0.0.1:1?replica_ack=65", `"replica_ack"`},
		{"redis://127.0.0.1:1?replica_ack_timeout=1s", "needs replica_ack"},
		{"redis://127.0.0.1:1?replica_ack=1&replica_ack_timeout=0s", `"replica_ack_timeout"`},
		{"redis://127.0.0.1:1?replica_ack=1&replica_ack_timeout=2m", "outside [1ms, 1m]"},
		{"redis://127.0.0.1:1?replica_ack=1&replica_ack_timeout=50s&read_timeout=50s", "below the client's ReadTimeout 50s"},
		{"redis://127.0.0.1:1?replica_ack=1&replica_ack_timeout=1s&read_timeout=500ms", "below the client's ReadTimeout 500ms"},
		{"redis+cluster://127.0.0.1:1?replica_ack=1", "not supported with a Cluster client"},
	} {
		_, err := Open(ctx, tc.url)
		if !errors.Is(err, locker.ErrInvalidURL) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%s) = %v, want ErrInvalidURL containing %q", tc.url, err, tc.want)
		}
	}
	if _, err := Open(ctx, "redis://127.0.0.1:1?replica_ack=1&replica_ack_timeout=5s&read_timeout=10s"); err != nil {
		t.Errorf("a timeout below read_timeout: %v", err)
	}
}

func TestReplicaAckOption(t *testing.T) {
	ctx := testCtx(t)
	for _, tc := range []struct {
		n    int
		d    time.Duration
		want string
	}{
		{-1, time.Second, "outside [0, 64]"},
		{1, 0, "outside [1ms, 1m]"},
		{1, time.Microsecond, "outside [1ms, 1m]"},
	} {
		l := New(goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"}), WithReplicaAck(tc.n, tc.d))
		_, err := l.TryAcquire(ctx, "k")
		if !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("WithReplicaAck(%d, %v): TryAcquire = %v, want ErrInvalidOption containing %q", tc.n, tc.d, err, tc.want)
		}
		l.Close()
	}
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	l := New(cc, WithReplicaAck(1, time.Second))
	defer l.Close()
	if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), "Cluster") {
		t.Errorf("WithReplicaAck on a Cluster client: TryAcquire = %v", err)
	}
}
