package allbackends_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"

	_ "github.com/go-locker/locker/etcd"
	_ "github.com/go-locker/locker/memlock"
	_ "github.com/go-locker/locker/postgres"
	_ "github.com/go-locker/locker/redis"
	_ "github.com/go-locker/locker/redis/redlock"
	_ "github.com/go-locker/locker/sqltable/mysql"
	_ "github.com/go-locker/locker/sqltable/pgx"
	_ "github.com/go-locker/locker/sqltable/sqlite"
	_ "github.com/go-locker/locker/zookeeper"
)

// Every backend's URL opener knows the shared parameters by the same
// names (backend.SharedParams): each is accepted, or, where the backend
// cannot honour it and must not ignore it, refused with an error that
// names it. An unknown parameter is refused by name everywhere. The
// addresses are dead: the openers connect at the first call, except
// ZooKeeper's, which connects in Open, so there a parameter counts as
// accepted when Open got past the URL and failed to connect.
func TestSharedURLParameters(t *testing.T) {
	dir := t.TempDir()
	backends := []struct {
		name, url string
		refused   []string // shared parameters (as name=value) refused
		connects  bool     // Open connects: a connection error means the URL was accepted
	}{
		{"memlock", "mem://shared-params", []string{"prefix=/app", "watchdog=false"}, false},
		{"redis", "redis://127.0.0.1:1/0", nil, false},
		{"redis+cluster", "redis+cluster://127.0.0.1:1", nil, false},
		{"redlock", "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", []string{"watchdog=false"}, false},
		{"postgres", "postgres://u:p@127.0.0.1:1/db", []string{"watchdog=false"}, false},
		{"zookeeper", "zookeeper://127.0.0.1:1", []string{"watchdog=false"}, true},
		{"etcd", "etcd://127.0.0.1:1", []string{"watchdog=false"}, false},
		{"sqlite", "sqlite://" + filepath.ToSlash(filepath.Join(dir, "l.db")), []string{"prefix=/app"}, false},
		{"mysql", "mysql://u:p@127.0.0.1:1/db", []string{"prefix=/app"}, false},
		{"postgres+table", "postgres+table://u:p@127.0.0.1:1/db", []string{"prefix=/app"}, false},
	}
	params := []string{"ttl=5s", "drift_margin=200ms", "prefix=/app", "retry_interval=500ms", "ddl=false", "ddl=true", "watchdog=false", "watchdog=true", "token_base=0", "token_base=4611686018427387904"}
	// Every shared parameter is in the table above.
	for _, name := range backend.SharedParams {
		found := false
		for _, p := range params {
			found = found || strings.HasPrefix(p, name+"=")
		}
		if !found {
			t.Fatalf("shared parameter %s is not tested", name)
		}
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			open := func(query string) error {
				timeout := 10 * time.Second
				if b.connects {
					timeout = 300 * time.Millisecond
				}
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				l, err := locker.Open(ctx, b.url+"?"+query)
				if err == nil {
					_ = l.Close()
				}
				if b.connects && err != nil && !errors.Is(err, locker.ErrInvalidURL) && !errors.Is(err, locker.ErrInvalidOption) && strings.Contains(err.Error(), "connecting") {
					return nil // past the URL
				}
				return err
			}
			for _, p := range params {
				err := open(p)
				name, _, _ := strings.Cut(p, "=")
				switch refused := contains(b.refused, p); {
				case refused && (!errors.Is(err, locker.ErrInvalidURL) || !strings.Contains(err.Error(), `"`+name+`"`)):
					t.Errorf("%s: %v; want an error wrapping ErrInvalidURL naming %q", p, err, name)
				case !refused && err != nil:
					t.Errorf("%s: refused: %v", p, err)
				}
			}
			if err := open(strings.Join(params[:5], "&")); len(b.refused) == 0 && err != nil {
				t.Errorf("all shared parameters together: %v", err)
			}
			for _, bad := range []string{"ttl=soon", "drift_margin=-1s", "retry_interval=0s", "ddl=maybe", "token_base=-1", "token_base=4611686018427387905", "token_base=1e6"} {
				name, _, _ := strings.Cut(bad, "=")
				if err := open(bad); !errors.Is(err, locker.ErrInvalidURL) && !errors.Is(err, locker.ErrInvalidOption) || err == nil || !strings.Contains(err.Error(), name) && !strings.Contains(err.Error(), "Retry") && !strings.Contains(err.Error(), "Drift") {
					t.Errorf("%s: %v; want an error naming %s", bad, err, name)
				}
			}
			if err := open("no_such_param=1"); !errors.Is(err, locker.ErrInvalidURL) || !strings.Contains(err.Error(), "no_such_param") {
				t.Errorf("an unknown parameter: %v; want ErrInvalidURL naming no_such_param", err)
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
