// Package deps checks what a program that uses locker downloads: a consumer
// module that imports the root package and one backend must get from
// `go mod tidy` the backend's client library and nothing of the test
// infrastructure (testcontainers, the Docker client, Toxiproxy, other
// backends' clients), which lives in this integration module instead.
package deps

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// forbidden are module path fragments that must not reach a consumer's go.sum
// through the root module: test infrastructure and the clients of backends the
// consumer did not import.
var forbidden = []string{
	"testcontainers", "moby", "docker", "toxiproxy", "zerolog",
	"go-sql-driver/mysql", "go-zookeeper", "etcd", "opentelemetry", "prometheus",
}

func TestConsumerGoSum(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs go mod tidy in temporary modules")
	}
	for _, c := range []struct {
		name    string
		imports []string
		// client is what a program that uses the backend's client library
		// directly imports: the backend may cost no module beyond it (and
		// goleak, the conformance suite's one dependency).
		client []string
	}{
		{"RootOnly", []string{"github.com/go-locker/locker"}, nil},
		{"Memlock", []string{"github.com/go-locker/locker", "github.com/go-locker/locker/memlock"}, nil},
		{"Redis", []string{"github.com/go-locker/locker", "github.com/go-locker/locker/redis"}, []string{"github.com/redis/go-redis/v9"}},
		{"Postgres", []string{"github.com/go-locker/locker", "github.com/go-locker/locker/postgres"}, []string{"github.com/jackc/pgx/v5/pgxpool"}},
		{"ZooKeeper", []string{"github.com/go-locker/locker", "github.com/go-locker/locker/zookeeper"}, []string{"github.com/go-zookeeper/zk"}},
		{"Etcd", []string{"github.com/go-locker/locker", "github.com/go-locker/locker/etcd"}, []string{"go.etcd.io/etcd/client/v3"}},
		// sqltable imports its three drivers itself, so that Open takes a
		// sqlite:, mysql:// or postgres+table:// URL with one import, and
		// fsnotify, which watches SQLite's signal file (waiters in other
		// processes).
		{"SQLTable", []string{"github.com/go-locker/locker", "github.com/go-locker/locker/sqltable"}, []string{"github.com/jackc/pgx/v5/stdlib", "github.com/go-sql-driver/mysql", "modernc.org/sqlite", "github.com/fsnotify/fsnotify"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			mods, lines := tidy(t, c.imports)
			t.Logf("go.sum: %d lines, %d modules", lines, len(mods))
			var base map[string]bool
			if c.client != nil {
				base, _ = tidy(t, c.client)
			}
			for m := range mods {
				for _, bad := range forbidden {
					if strings.Contains(strings.ToLower(m), bad) && !base[m] {
						t.Errorf("go.sum of a consumer importing %v lists %s (test infrastructure or another backend's client)", c.imports, m)
					}
				}
				if !base[m] && m != "go.uber.org/goleak" {
					t.Errorf("go.sum of a consumer importing %v lists %s, which a program importing only %v does not need", c.imports, m, c.client)
				}
			}
		})
	}
}

// tidy runs go mod tidy in a new module that requires the root module (from
// this checkout) and imports imports, and returns the modules its go.sum
// lists and the number of lines.
func tidy(t *testing.T, imports []string) (map[string]bool, int) {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to run go mod tidy: %v", err)
	}
	_, file, _, _ := runtime.Caller(0)
	root, err := filepath.Abs(filepath.Join(filepath.Dir(file), "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var src strings.Builder
	src.WriteString("package main\n\nimport (\n")
	for _, imp := range imports {
		src.WriteString("\t_ \"" + imp + "\"\n")
	}
	src.WriteString(")\n\nfunc main() {}\n")
	// The root module is required even where it is not imported, so that
	// the client library resolves to the version the root requires.
	mod := "module example.com/consumer\n\ngo 1.26\n\nrequire github.com/go-locker/locker v0.0.0\n\nreplace github.com/go-locker/locker => " + root + "\n"
	write(t, filepath.Join(dir, "go.mod"), mod)
	write(t, filepath.Join(dir, "main.go"), src.String())
	if !slices.Contains(imports, "github.com/go-locker/locker") {
		write(t, filepath.Join(dir, "keep.go"), "package main\n\nimport _ \"github.com/go-locker/locker\"\n")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "mod", "tidy")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go mod tidy in a consumer module importing %v: %v\n%s", imports, err, out)
	}
	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	lines, mods := 0, map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(sum))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		lines++
		mods[f[0]] = true
	}
	return mods, lines
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
