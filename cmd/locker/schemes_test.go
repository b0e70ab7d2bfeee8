package main

import (
	"slices"
	"testing"

	"github.com/go-locker/locker"

	// Every backend, as locker-full links them: their schemes are what
	// locker must serve or hand over.
	_ "github.com/go-locker/locker/etcd"
	_ "github.com/go-locker/locker/postgres"
	_ "github.com/go-locker/locker/redis"
	_ "github.com/go-locker/locker/redis/redlock"
	_ "github.com/go-locker/locker/sqltable/mysql"
	_ "github.com/go-locker/locker/sqltable/pgx"
	_ "github.com/go-locker/locker/sqltable/sqlite"
	_ "github.com/go-locker/locker/zookeeper"
)

// ownSchemes are the schemes locker serves itself.
var ownSchemes = []string{"sqlite"}

// TestFullSchemes: every scheme a backend registers is served by locker
// itself or handed to locker-full, so that none fails in locker as unknown
// or for want of a driver; and fullSchemes names no scheme that nothing
// serves.
func TestFullSchemes(t *testing.T) {
	all := locker.Schemes()
	for _, s := range all {
		if !slices.Contains(ownSchemes, s) && !slices.Contains(fullSchemes, s) {
			t.Errorf("scheme %q (registered by a backend of locker-full) is neither served by locker nor in fullSchemes", s)
		}
	}
	for _, s := range append(slices.Clone(ownSchemes), fullSchemes...) {
		if !slices.Contains(all, s) {
			t.Errorf("scheme %q is in ownSchemes or fullSchemes, but no backend registers it (registered: %v)", s, all)
		}
	}
}
