package pgx_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/go-locker/locker"
	_ "github.com/go-locker/locker/sqltable/pgx"
)

func TestOpenErrors(t *testing.T) {
	const secret = "s3cr3t-pw"
	for _, c := range []struct {
		url     string
		invalid bool   // wraps ErrInvalidURL
		want    string // in the message
	}{
		{"postgres+table://u:" + secret + "@h:5432/db?lock_table=", true, `parameter "lock_table" is empty`},
		{"postgres+table://u:" + secret + "@h:5432/db?bogus=1", true, `unknown parameter(s) bogus`},
		{"postgres+table://u:" + secret + "@h:5432/db?lock_bogus=1", true, `unknown parameter(s) lock_bogus`},
		{"postgres+table://u:" + secret + "@h:5432/db?sslmode=nonsense", true, `sslmode`},
		{"postgres+table://u:" + secret + "@h:5432/db?lock_notify=maybe", true, `not true or false`},
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
		"postgres+table://u:p@127.0.0.1:1/db?sslmode=disable&connect_timeout=1&lock_notify=false",
		"postgresql+table://u:p@127.0.0.1:1/db",
		"postgres+table://u:p@127.0.0.1:1/db?lock_table=temp.locks",        // an ordinary schema on PostgreSQL
		"postgres+table://u:p@127.0.0.1:1/db?lock_table=pg_temporal.locks", // not a temporary one
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

// TestTemporarySchemaRefused: a table in a temporary schema, where each
// connection has tables of its own, is refused by Open with an error
// naming the option.
func TestTemporarySchemaRefused(t *testing.T) {
	for _, u := range []string{
		"postgres+table://u:p@127.0.0.1:1/db?lock_table=pg_temp.locks",
		"postgres+table://u:p@127.0.0.1:1/db?lock_table=PG_TEMP.locks",
		"postgres+table://u:p@127.0.0.1:1/db?lock_table=pg_temp_12.locks",
		"postgres+table://u:p@127.0.0.1:1/db?lock_table=pg_toast_temp_3.locks",
	} {
		l, err := locker.Open(context.Background(), u)
		if err == nil {
			l.Close()
			t.Errorf("Open(%q) succeeded", u)
			continue
		}
		if !errors.Is(err, locker.ErrInvalidURL) || !errors.Is(err, locker.ErrInvalidOption) || !errors.Is(err, locker.ErrUnsafeConfig) || !strings.Contains(err.Error(), "lock_table") {
			t.Errorf("Open(%q) = %v; want ErrInvalidURL, ErrInvalidOption and an unsafe configuration naming lock_table", u, err)
		}
	}
}
