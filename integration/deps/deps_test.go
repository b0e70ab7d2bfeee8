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
	"jackc/pgx", "modernc.org", "fsnotify",
}

// otelAPI are the OpenTelemetry modules that observe imports.
var otelAPI = []string{"go.opentelemetry.io/otel", "go.opentelemetry.io/otel/metric", "go.opentelemetry.io/otel/trace"}

// otelTested are the packages that observe and its tests import.
var otelTested = append(slices.Clone(otelAPI), "go.opentelemetry.io/otel/sdk/metric", "go.opentelemetry.io/otel/sdk/trace")

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
		// sqltable imports no driver: each driver package brings its
		// driver, and the SQLite one fsnotify, which watches SQLite's
		// signal file (waiters in other processes).
		{"SQLTable", []string{"github.com/go-locker/locker", "github.com/go-locker/locker/sqltable"}, nil},
		{"SQLTablePgx", []string{"github.com/go-locker/locker", "github.com/go-locker/locker/sqltable/pgx"}, []string{"github.com/jackc/pgx/v5/stdlib"}},
		{"SQLTableMySQL", []string{"github.com/go-locker/locker", "github.com/go-locker/locker/sqltable/mysql"}, []string{"github.com/go-sql-driver/mysql"}},
		{"SQLTableSQLite", []string{"github.com/go-locker/locker", "github.com/go-locker/locker/sqltable/sqlite"}, []string{"modernc.org/sqlite", "github.com/fsnotify/fsnotify"}},
		// observe brings OpenTelemetry, and only to a program that imports
		// it: the API, which it links, and the SDK's metric and trace
		// packages, which its tests and examples use (go mod tidy keeps
		// the checksums of the tests of the packages a program imports;
		// the program does not link them).
		{"Observe", []string{"github.com/go-locker/locker", "github.com/go-locker/locker/observe"}, otelTested},
		{"RedisObserve", []string{"github.com/go-locker/locker", "github.com/go-locker/locker/redis", "github.com/go-locker/locker/observe"}, append([]string{"github.com/redis/go-redis/v9"}, otelTested...)},
	} {
		t.Run(c.name, func(t *testing.T) {
			mods, lines := tidy(t, c.imports)
			t.Logf("go.sum: %d lines, %d modules", lines, len(mods))
			var base map[string]bool
			if len(c.client) > 0 {
				base, _ = tidy(t, c.client)
			}
			// OpenTelemetry reaches a consumer's go.sum through the root
			// module only when it imports observe (a backend's client may
			// bring it of its own: etcd's gRPC does). The client's own
			// modules are those of a program that imports the client
			// alone, not the root package, which base imports too.
			var own map[string]bool
			if len(c.client) > 0 {
				own, _ = tidyKeep(t, c.client, false)
			}
			observed := slices.Contains(c.imports, "github.com/go-locker/locker/observe")
			for _, m := range otelAPI {
				if observed && !mods[m] {
					t.Errorf("go.sum of a consumer importing %v lacks %s", c.imports, m)
				}
			}
			for m := range mods {
				if strings.HasPrefix(m, "go.opentelemetry.io/") && !observed && !own[m] {
					t.Errorf("go.sum of a consumer importing %v, not observe, lists %s", c.imports, m)
				}
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
	return tidyKeep(t, imports, !slices.Contains(imports, "github.com/go-locker/locker"))
}

// tidyKeep is tidy, the root package imported as well when keepRoot.
func tidyKeep(t *testing.T, imports []string, keepRoot bool) (map[string]bool, int) {
	t.Helper()
	var src strings.Builder
	src.WriteString("package main\n\nimport (\n")
	for _, imp := range imports {
		src.WriteString("\t_ \"" + imp + "\"\n")
	}
	src.WriteString(")\n\nfunc main() {}\n")
	dir := consumer(t, src.String(), keepRoot)
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

// consumer makes a new module, in a temporary directory that it returns,
// that requires the root module (from this checkout) and whose main.go is
// src, and runs go mod tidy in it. With keepRoot, it also imports the root
// package, so that a client library resolves to the version the root
// requires.
func consumer(t *testing.T, src string, keepRoot bool) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root, err := filepath.Abs(filepath.Join(filepath.Dir(file), "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// The root module is required even where it is not imported, so that
	// the client library resolves to the version the root requires.
	mod := "module example.com/consumer\n\ngo 1.26\n\nrequire github.com/go-locker/locker v0.0.0\n\nreplace github.com/go-locker/locker => " + root + "\n"
	write(t, filepath.Join(dir, "go.mod"), mod)
	write(t, filepath.Join(dir, "main.go"), src)
	if keepRoot {
		write(t, filepath.Join(dir, "keep.go"), "package main\n\nimport _ \"github.com/go-locker/locker\"\n")
	}
	goCmd(t, dir, "mod", "tidy")
	return dir
}

// goCmd runs the go command in dir and returns its output.
func goCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

// onePgx is a one-line program on a PostgreSQL lock table (issue 29: with
// sqltable linking its three drivers it was a 21 MB binary).
const onePgx = `package main

import (
	"context"
	"os"

	"github.com/go-locker/locker"
	_ "github.com/go-locker/locker/sqltable/pgx"
)

func main() {
	l, err := locker.Open(context.Background(), os.Getenv("LOCKER_URL"))
	if err == nil {
		l.Close()
	}
}
`

// TestDriverLinking: a program that imports sqltable with only the pgx
// driver package links neither SQLite (modernc.org/sqlite, and fsnotify,
// which only SQLite's signal file needs) nor go-sql-driver/mysql, as
// go version -m on its binary shows; the test logs its size beside that of
// the same program with the three driver packages (the locker command's
// choice).
func TestDriverLinking(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds programs")
	}
	build := func(src string) (deps string, size int64) {
		dir := consumer(t, src, false)
		bin := filepath.Join(dir, "prog")
		goCmd(t, dir, "build", "-o", bin, ".")
		fi, err := os.Stat(bin)
		if err != nil {
			t.Fatal(err)
		}
		return goCmd(t, dir, "version", "-m", bin), fi.Size()
	}
	deps, size := build(onePgx)
	for _, m := range []string{"github.com/jackc/pgx/v5"} {
		if !strings.Contains(deps, "\t"+m+"\t") {
			t.Errorf("the pgx program does not link %s:\n%s", m, deps)
		}
	}
	for _, m := range []string{"modernc.org/sqlite", "modernc.org/libc", "github.com/go-sql-driver/mysql", "github.com/fsnotify/fsnotify"} {
		if strings.Contains(deps, "\t"+m+"\t") {
			t.Errorf("a program importing sqltable and only its pgx driver package links %s:\n%s", m, deps)
		}
	}
	all := strings.Replace(onePgx, "\t_ \"github.com/go-locker/locker/sqltable/pgx\"\n",
		"\t_ \"github.com/go-locker/locker/sqltable/mysql\"\n\t_ \"github.com/go-locker/locker/sqltable/pgx\"\n\t_ \"github.com/go-locker/locker/sqltable/sqlite\"\n", 1)
	allDeps, allSize := build(all)
	if !strings.Contains(allDeps, "\tmodernc.org/sqlite\t") || !strings.Contains(allDeps, "\tgithub.com/go-sql-driver/mysql\t") {
		t.Errorf("the program with the three driver packages does not link their drivers:\n%s", allDeps)
	}
	t.Logf("binary of a one-line program on postgres+table://: %.1f MB with sqltable/pgx only, %.1f MB with the three driver packages", float64(size)/1e6, float64(allSize)/1e6)
}

// forgotten is a program that uses modernc.org/sqlite's *sql.DB with
// sqltable but imports neither sqltable/sqlite nor any other driver
// package, and URLs of the three dialects.
const forgotten = `package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/sqltable"
)

func main() {
	db, err := sql.Open("sqlite", filepath.Join(os.TempDir(), "forgotten.db"))
	if err != nil {
		panic(err)
	}
	fmt.Println(sqltable.New(db).Err())
	for _, u := range []string{"sqlite:x.db", "mysql://u@h/db", "postgres+table://u@h/db"} {
		_, err := locker.Open(context.Background(), u)
		fmt.Println(err)
	}
}
`

// TestForgottenDriverImport: New on a *sql.DB of a driver whose sqltable
// driver package the program forgot, and a URL of each dialect without its
// package, fail with an error that names the package to import.
func TestForgottenDriverImport(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds a program")
	}
	out := goCmd(t, consumer(t, forgotten, false), "run", ".")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []string{"sqltable/sqlite", "sqltable/sqlite", "sqltable/mysql", "sqltable/pgx"}
	if len(lines) != len(want) {
		t.Fatalf("the program printed %d lines, want %d:\n%s", len(lines), len(want), out)
	}
	for i, l := range lines {
		if !strings.Contains(l, `import _ "github.com/go-locker/locker/`+want[i]+`"`) || !strings.Contains(l, "forgotten import?") {
			t.Errorf("line %d: %s\nwant an error naming github.com/go-locker/locker/%s (forgotten import?)", i+1, l, want[i])
		}
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
