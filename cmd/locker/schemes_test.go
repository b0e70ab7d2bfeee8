package main

import (
	"os/exec"
	"slices"
	"strings"
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

// TestSlimDeps: the locker binary links none of the packages that made its
// start slow (each adds its init and pages to every locker run on the
// default): the server backends' clients, crypto/tls (backend/tlsurl keeps
// it out of the shared URL helpers), the bench command's plotting.
func TestSlimDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "modernc.org/sqlite") {
		t.Fatalf("go list -deps names no modernc.org/sqlite: the list is not locker's (%d packages)", len(deps))
	}
	for _, bad := range []string{
		"crypto/tls", "google.golang.org/grpc", "go.etcd.io/etcd/client/v3",
		"github.com/redis/go-redis/v9", "github.com/jackc/pgx/v5", "github.com/go-sql-driver/mysql",
		"github.com/go-zookeeper/zk", "gonum.org/v1/plot",
		"github.com/go-locker/locker/cmd/locker/internal/benchcmd",
	} {
		if slices.Contains(deps, bad) {
			t.Errorf("locker links %s; keep it in locker-full", bad)
		}
	}
}
