package zookeeper

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
	u, err := url.Parse("zookeeper://alice:s3cret@h1:2181,h2,h3:2182/app/locks?ttl=4s&drift_margin=300ms&containers=false&acl=creator")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := parseURL(u)
	if err != nil {
		t.Fatalf("parseURL: %v", err)
	}
	if want := []string{"h1:2181", "h2:2181", "h3:2182"}; strings.Join(cfg.servers, " ") != strings.Join(want, " ") {
		t.Errorf("servers = %v, want %v", cfg.servers, want)
	}
	c := newConfig(cfg.opts)
	switch {
	case c.err != nil:
		t.Errorf("config error: %v", c.err)
	case c.Prefix != "/app/locks":
		t.Errorf("root = %q", c.Prefix)
	case c.TTL != 4*time.Second:
		t.Errorf("default TTL = %v", c.TTL)
	case c.DriftMargin != 300*time.Millisecond:
		t.Errorf("drift = %v", c.DriftMargin)
	case c.containers:
		t.Errorf("containers = true, want false")
	case len(c.auth) != 1 || c.auth[0].scheme != "digest" || string(c.auth[0].auth) != "alice:s3cret":
		t.Errorf("auth = %+v", c.auth)
	case len(c.acl) != 1 || c.acl[0].Scheme != "auth":
		t.Errorf("acl = %+v", c.acl)
	}
}

func TestParseURLDefaults(t *testing.T) {
	u, _ := url.Parse("zookeeper://127.0.0.1")
	cfg, err := parseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	c := newConfig(cfg.opts)
	if c.Prefix != DefaultRoot || c.sessionTimeout != 0 || !c.containers || len(c.auth) != 0 || cfg.servers[0] != "127.0.0.1:2181" {
		t.Errorf("defaults: %+v %v", c, cfg.servers)
	}
}

func TestParseURLBracketedIPv6(t *testing.T) {
	for raw, want := range map[string]string{
		"zookeeper://[::1]":      "[::1]:2181",
		"zookeeper://[::1]:2182": "[::1]:2182",
	} {
		u, _ := url.Parse(raw)
		cfg, err := parseURL(u)
		if err != nil {
			t.Fatalf("parseURL(%s): %v", raw, err)
		}
		if len(cfg.servers) != 1 || cfg.servers[0] != want {
			t.Errorf("parseURL(%s): servers %v, want [%s]", raw, cfg.servers, want)
		}
	}
}

func TestParseURLRejects(t *testing.T) {
	for _, raw := range []string{
		"zookeeper://h1:2181?unknown=1",
		"zookeeper://h1:2181?session_timeout=10s", // gone: ttl
		"zookeeper://h1:2181?ttl=10",
		"zookeeper://h1:2181?ttl=10ms",
		"zookeeper://h1:2181?ttl=1s&ttl=2s",
		"zookeeper://h1:2181?containers=maybe",
		"zookeeper://h1:2181?acl=creator",
		"zookeeper://u:p@h1:2181?acl=everyone",
		"zookeeper://h1:2181?drift_margin=1ms",
		"zookeeper:///locker",
		"zookeeper://h1:2181/zookeeper",
		"zookeeper://h1:2181/a//b",
		"zookeeper://h1:2181/a/#frag",
		"zookeeper:opaque",
		"zookeeper://h1:99999999",
		"zookeeper://h1:0,h2:2181",
		"zookeeper://h1:2181/a%2Fb",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		if _, err := parseURL(u); !errors.Is(err, locker.ErrInvalidURL) {
			t.Errorf("parseURL(%s) = %v, want an error wrapping locker.ErrInvalidURL", raw, err)
		}
	}
}

func TestOpenHidesPassword(t *testing.T) {
	const pw = "Sup3r-S3cret"
	for _, raw := range []string{
		"zookeeper://alice:" + pw + "@h1:2181?nope=1",
		"zookeeper://alice:" + pw + "@h1:2181?acl=bad",
		"zookeeper://alice:" + pw + "@h1:bad",
	} {
		_, err := locker.Open(context.Background(), raw)
		if err == nil {
			t.Fatalf("Open(%q) succeeded", raw)
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("Open error shows the password: %v", err)
		}
	}
}

func TestRegistered(t *testing.T) {
	for _, s := range locker.Schemes() {
		if s == Scheme {
			return
		}
	}
	t.Errorf("scheme %q is not registered", Scheme)
}
