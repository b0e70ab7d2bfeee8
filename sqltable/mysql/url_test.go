package mysql_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/go-locker/locker"
	_ "github.com/go-locker/locker/sqltable/mysql"
)

func TestOpenErrors(t *testing.T) {
	const secret = "s3cr3t-pw"
	for _, c := range []struct {
		url     string
		invalid bool   // wraps ErrInvalidURL
		want    string // in the message
	}{
		{"mysql://u:" + secret + "@h:3306/db?lock_table=", true, `parameter "lock_table" is empty`},
		{"mysql://u:" + secret + "@h:3306/db?bogus=1", true, `unknown parameter(s) bogus`},
		{"mysql://u:" + secret + "@h:3306/", true, `must name one database`},
		{"mysql://u:" + secret + "@h:3306/db?tls=maybe", true, `"maybe" is not true, false`},
		{"mysql://u:" + secret + "@h:3306/db?timeout=x", true, `not a duration`},
		{"mysql://u:" + secret + "@h:3306/db?lock_notify=maybe", true, `not true or false`},
	} {
		l, err := locker.Open(context.Background(), c.url)
		if err == nil {
			l.Close()
			t.Errorf("Open(%q) succeeded", c.url)
			continue
		}
		if c.invalid != errors.Is(err, locker.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v; wraps ErrInvalidURL: %v, want %v", c.url, err, !c.invalid, c.invalid)
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open(%q) = %v, want it to say %q", c.url, err, c.want)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%q) echoes the password: %v", c.url, err)
		}
	}
}

func TestOpenDoesNotConnect(t *testing.T) {
	for _, u := range []string{
		"mysql://u:p@127.0.0.1:1/db?timeout=1s&ttl=5s",
		"mysql://u:p@127.0.0.1:1/db?timeout=1s&lock_notify=false",
		"mysql://u:p@127.0.0.1:1/db?lock_table=temp.locks", // an ordinary schema on MySQL
	} {
		l, err := locker.Open(context.Background(), u)
		if err != nil {
			t.Errorf("Open(%q): %v", u, err)
			continue
		}
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}
