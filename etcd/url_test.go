package etcd

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

func TestParseURL(t *testing.T) {
	u, _ := url.Parse("etcds://bob:s3cret@h2,h1:2380/app/locks?ttl=5s&drift_margin=200ms&dial_timeout=1s")
	cfg, err := parseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.tls || cfg.user != "bob" || cfg.password != "s3cret" || cfg.dialTimeout != time.Second {
		t.Errorf("cfg = %+v", cfg)
	}
	if got := strings.Join(cfg.endpoints, ","); got != "h2:2379,h1:2380" {
		t.Errorf("endpoints = %s", got)
	}
	c := newConfig(cfg.opts)
	if c.Prefix != "/app/locks" || c.TTL != 5*time.Second || c.DriftMargin != 200*time.Millisecond {
		t.Errorf("config = %+v", c)
	}
}

func TestParseURLRejects(t *testing.T) {
	for _, raw := range []string{
		"redis://h",
		"etcd://",
		"etcd:opaque",
		"etcd://h/locks/",
		"etcd://h?ttl=1",
		"etcd://h?ttl=100ms",
		"etcd://h?ttl=1s&ttl=2s",
		"etcd://h?unknown=1",
		"etcd://h:0",
		"etcd://h:99999",
		"etcd://h,,g",
		"etcd://h#frag",
		"etcd://:pw@h",
		"etcd://[::1",
		"etcd://h,[zz]",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			continue
		}
		if _, err := parseURL(u); !errors.Is(err, locker.ErrInvalidURL) {
			t.Errorf("parseURL(%q) = %v, want an error wrapping locker.ErrInvalidURL", raw, err)
		}
	}
}

// A user without a password (or with an empty one) would connect without
// authentication: clientv3 logs in only when both are set.
func TestParseURLRejectsUserWithoutPassword(t *testing.T) {
	for _, raw := range []string{"etcd://user@h", "etcd://user:@h", "etcds://user@h1:2379,h2:2379"} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		_, err = parseURL(u)
		if !errors.Is(err, locker.ErrInvalidURL) || !strings.Contains(err.Error(), "password") {
			t.Errorf("parseURL(%q) = %v, want an error wrapping ErrInvalidURL about the missing password", raw, err)
		}
	}
}

func TestOpenHidesPassword(t *testing.T) {
	const pw = "t0p-s3cret-pw"
	for _, raw := range []string{
		"etcd://u:" + pw + "@h:99999999",
		"etcd://u:" + pw + "@h?bogus=1",
		"etcd://u:" + pw[:4] + "/" + pw[4:] + "@h",
		"etcd://u:" + pw + "@h?%zz",
	} {
		_, err := Open(context.Background(), raw)
		if err == nil {
			t.Errorf("Open(%q) succeeded", raw)
			continue
		}
		for _, part := range []string{pw, pw[:4], pw[4:]} {
			if strings.Contains(err.Error(), part) {
				t.Errorf("Open error echoes the password: %v", err)
			}
		}
	}
}

func TestSchemesRegistered(t *testing.T) {
	schemes := strings.Join(locker.Schemes(), " ")
	for _, s := range []string{Scheme, SchemeTLS} {
		if !strings.Contains(schemes, s) {
			t.Errorf("scheme %q not registered (have %s)", s, schemes)
		}
	}
}

// Open contacts no server (as redis and postgres Open do not): an
// unreachable one shows in the first call, bounded by its context.
func TestOpenDoesNotConnect(t *testing.T) {
	start := time.Now()
	l, err := Open(context.Background(), "etcd://127.0.0.1:1/locker?ttl=2s")
	if err != nil {
		t.Fatalf("Open of an unreachable server: %v, want a Locker (Open does not connect)", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Open took %v: it waited for the server", took)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := l.Acquire(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire on an unreachable server = %v, want an error wrapping context.DeadlineExceeded", err)
	}
	start = time.Now()
	if err := l.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if took := time.Since(start); took > closeWait+time.Second {
		t.Errorf("Close took %v", took)
	}
}
