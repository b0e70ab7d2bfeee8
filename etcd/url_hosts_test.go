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

// Open's errors for a host list say what is wrong, not a hint about
// percent-encoding a password.
func TestOpenHostListErrors(t *testing.T) {
	for _, tc := range []struct{ raw, want, not string }{
		{"etcd://h1:2379,h2", "last host", "percent-encode"},
		{"etcd://u:pw@h1:2379,h2/p", "last host", "percent-encode"},
		{"etcd://h1,h2:x", "port", "percent-encode"},
	} {
		_, err := Open(context.Background(), tc.raw)
		if err == nil || !errors.Is(err, locker.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v, want an error wrapping ErrInvalidURL", tc.raw, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), tc.not) {
			t.Errorf("Open(%q) = %v, want it to mention %q and not %q", tc.raw, err, tc.want, tc.not)
		}
		if strings.Contains(err.Error(), "pw") {
			t.Errorf("Open(%q) error echoes the password: %v", tc.raw, err)
		}
	}
}

// A bracketed IPv6 address without a port gets the default port.
func TestParseURLBracketedIPv6DefaultPort(t *testing.T) {
	for raw, want := range map[string]string{
		"etcd://[::1]":      "[::1]:2379",
		"etcd://[::1]:2380": "[::1]:2380",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := parseURL(u)
		if err != nil {
			t.Errorf("parseURL(%q): %v", raw, err)
			continue
		}
		if got := strings.Join(cfg.endpoints, ","); got != want {
			t.Errorf("parseURL(%q) endpoints = %s, want %s", raw, got, want)
		}
	}
}

// The client Open makes sends gRPC keepalives, so that a connection to a
// member that stopped answering is noticed and dropped.
func TestOpenClientKeepalive(t *testing.T) {
	u, _ := url.Parse("etcd://h:2379")
	cfg, err := parseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	cc := clientConfig(context.Background(), cfg)
	if cc.DialKeepAliveTime <= 0 || cc.DialKeepAliveTimeout <= 0 || cc.DialKeepAliveTime < 5*time.Second {
		t.Errorf("keepalive time %v timeout %v: want both set, the time at least etcd's 5s minimum", cc.DialKeepAliveTime, cc.DialKeepAliveTimeout)
	}
}
