package settings

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/lease"
)

type cfg struct {
	Core
	n int
}

type opt func(*cfg) error

func TestApplySkipsNilAndCollectsErrors(t *testing.T) {
	c := cfg{Core: Core{Limits: lease.Limits{Backend: "x"}}}
	bad, worse := errors.New("bad"), errors.New("worse")
	err := Apply(&c, []opt{
		nil,
		func(c *cfg) error { c.n++; return nil },
		func(c *cfg) error { return bad },
		func(c *cfg) error { c.n++; return worse },
	})
	if !errors.Is(err, bad) || !errors.Is(err, worse) || c.n != 2 {
		t.Fatalf("Apply = %v with %d options applied; want bad and worse, 2 applied", err, c.n)
	}
	if err := c.Set(backend.SetDefaultTTL(time.Millisecond)); !errors.Is(err, locker.ErrInvalidOption) || c.TTL != 0 {
		t.Errorf("Set(SetDefaultTTL) below the minimum = %v, TTL %v; want ErrInvalidOption, TTL unchanged", err, c.TTL)
	}
	if err := c.Set(backend.SetRetryInterval(0)); !errors.Is(err, locker.ErrInvalidOption) || !strings.HasPrefix(err.Error(), "x: ") {
		t.Errorf("Set(SetRetryInterval(0)) = %v, want ErrInvalidOption naming the backend", err)
	}
	if err := c.Set(backend.SetDriftMargin(-1)); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("Set(SetDriftMargin(-1)) = %v, want ErrInvalidOption", err)
	}
}

func TestDefaultContextTimeout(t *testing.T) {
	on := false
	DefaultContextTimeout(&on, url.Values{})
	if !on {
		t.Error("not turned on when the URL does not set it")
	}
	off := false
	DefaultContextTimeout(&off, url.Values{ContextTimeoutOption: {"false"}})
	if off {
		t.Error("turned on though the URL set it")
	}
}

func TestClientURLErrorHidesPassword(t *testing.T) {
	u, _ := url.Parse("redis://user:s3cret@host:1/?x=1")
	err := ClientURLError("redis", u, errors.New("redis: invalid URL redis://user:s3cret@host:1"))
	if !errors.Is(err, locker.ErrInvalidURL) {
		t.Errorf("%v does not wrap ErrInvalidURL", err)
	}
	if s := err.Error(); strings.Contains(s, "s3cret") {
		t.Errorf("%q shows the password", s)
	}
}
