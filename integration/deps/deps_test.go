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
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to run go mod tidy: %v", err)
	}
	_, file, _, _ := runtime.Caller(0)
	root, err := filepath.Abs(filepath.Join(filepath.Dir(file), "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		imports []string
		allowed []string // module path fragments the consumer may get (beyond the root)
	}{
		{"RootOnly", []string{"github.com/go-locker/locker"}, nil},
		{"Memlock", []string{"github.com/go-locker/locker", "github.com/go-locker/locker/memlock"}, nil},
		{"Redis", []string{"github.com/go-locker/locker", "github.com/go-locker/locker/redis"},
			[]string{"redis/go-redis", "cespare/xxhash", "dgryski/go-rendezvous"}},
		{"Postgres", []string{"github.com/go-locker/locker", "github.com/go-locker/locker/postgres"},
			[]string{"jackc/", "golang.org/x/", "stretchr/testify", "davecgh/go-spew", "pmezard/go-difflib", "gopkg.in/yaml", "kr/", "rogpeppe/", "stretchr/objx", "creack/pty"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			var src strings.Builder
			src.WriteString("package main\n\nimport (\n")
			for _, imp := range c.imports {
				src.WriteString("\t_ \"" + imp + "\"\n")
			}
			src.WriteString(")\n\nfunc main() {}\n")
			mod := "module example.com/consumer\n\ngo 1.26\n\nrequire github.com/go-locker/locker v0.0.0\n\nreplace github.com/go-locker/locker => " + root + "\n"
			write(t, filepath.Join(dir, "go.mod"), mod)
			write(t, filepath.Join(dir, "main.go"), src.String())

			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, goBin, "mod", "tidy")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("go mod tidy in the consumer module: %v\n%s", err, out)
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
			t.Logf("go.sum: %d lines, %d modules", lines, len(mods))
			for m := range mods {
				for _, bad := range forbidden {
					if strings.Contains(strings.ToLower(m), bad) {
						t.Errorf("go.sum of a consumer importing %v lists %s (test infrastructure or another backend's client)", c.imports, m)
					}
				}
				ok := m == "go.uber.org/goleak" // the conformance suite's one dependency
				for _, a := range c.allowed {
					ok = ok || strings.Contains(m, a)
				}
				if !ok {
					t.Errorf("go.sum of a consumer importing %v lists %s, which none of its imports needs", c.imports, m)
				}
			}
		})
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
