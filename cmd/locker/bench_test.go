package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"image"
	_ "image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/go-locker/locker/sqltable"
)

// benchShort are counts small enough for a test under -race, every case
// still run.
var benchShort = []string{"bench", "--ops", "20", "--handoffs", "10", "--waiters", "1,8,64", "--clients", "4", "--duration", "300ms"}

// benchRow is one parsed line of bench's table.
type benchRow struct {
	clients, ops     int
	p50, p99, max    string
	opsPerSec        float64
	shareLo, shareHi string
}

func parseBenchTable(t *testing.T, out string) map[string]benchRow {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) < 2 || !strings.HasPrefix(strings.TrimSpace(lines[0]), "CASE") {
		t.Fatalf("bench's stdout is not its table:\n%s", out)
	}
	head := strings.Join(strings.Fields(lines[0]), " ")
	if want := "CASE CLIENTS OPS P50 P90 P99 MAX OPS/S SHARE MIN SHARE MAX"; head != want {
		t.Errorf("table header %q, want %q", head, want)
	}
	rows := map[string]benchRow{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) != 10 {
			t.Fatalf("table row %q has %d fields, want 10", l, len(f))
		}
		var r benchRow
		var err1, err2, err3 error
		r.clients, err1 = strconv.Atoi(f[1])
		r.ops, err2 = strconv.Atoi(f[2])
		r.opsPerSec, err3 = strconv.ParseFloat(f[7], 64)
		if err := errors.Join(err1, err2, err3); err != nil {
			t.Fatalf("table row %q: %v", l, err)
		}
		r.p50, r.p99, r.max, r.shareLo, r.shareHi = f[3], f[5], f[6], f[8], f[9]
		rows[f[0]] = r
	}
	return rows
}

var latencyRE = regexp.MustCompile(`^[0-9.]+(µs|ms|s)$`)

func TestBench(t *testing.T) {
	e := newEnv(t)
	png := filepath.Join(t.TempDir(), "bench.png")
	r := e.run(append(benchShort, "--plot", png)...)
	r.want(t, 0, "bench")
	rows := parseBenchTable(t, r.stdout)
	for _, c := range []struct {
		name         string
		clients, ops int
		shares       bool
	}{
		{"uncontended", 1, 20, false},
		{"handoff/1", 2, 10, true},
		{"handoff/8", 9, 10, true},
		{"handoff/64", 65, 10, true},
		{"contended/4", 4, -1, true},
	} {
		row, ok := rows[c.name]
		if !ok {
			t.Errorf("the table has no row %s:\n%s", c.name, r.stdout)
			continue
		}
		if row.clients != c.clients || (c.ops >= 0 && row.ops != c.ops) || row.ops <= 0 {
			t.Errorf("%s: %d clients, %d ops; want %d, %d", c.name, row.clients, row.ops, c.clients, c.ops)
		}
		for _, l := range []string{row.p50, row.p99, row.max} {
			if !latencyRE.MatchString(l) {
				t.Errorf("%s: latency %q is not a duration", c.name, l)
			}
		}
		if row.opsPerSec <= 0 {
			t.Errorf("%s: %v ops/s", c.name, row.opsPerSec)
		}
		if c.shares == (row.shareLo == "-") {
			t.Errorf("%s: shares %s, %s", c.name, row.shareLo, row.shareHi)
		}
	}
	if len(rows) != 5 {
		t.Errorf("the table has %d rows, want 5:\n%s", len(rows), r.stdout)
	}
	// In a handoff the client that released waits for another holder, so
	// with one waiter the two clients alternate.
	if h := rows["handoff/1"]; h.shareLo != "50.0%" || h.shareHi != "50.0%" {
		t.Errorf("handoff/1 shares %s, %s; want 50.0%% each (the clients alternate)", h.shareLo, h.shareHi)
	}
	// stderr is not a terminal here: plain lines, no bar.
	if strings.ContainsAny(r.stderr, "\r\x1b") {
		t.Errorf("progress on a non-terminal has control characters: %q", r.stderr)
	}
	for _, c := range []string{"uncontended", "handoff/1", "handoff/8", "handoff/64", "contended"} {
		if !strings.Contains(r.stderr, "locker: bench: "+c+": ") {
			t.Errorf("stderr says nothing of %s: %s", c, r.stderr)
		}
	}

	f, err := os.Open(png)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, format, err := image.Decode(f)
	if err != nil {
		t.Fatalf("--plot %s does not decode: %v", png, err)
	}
	if b := img.Bounds(); format != "png" || b.Dx() < 400 || b.Dy() < 200 {
		t.Errorf("--plot %s: a %s of %v", png, format, b)
	}

	// Every lock of the run is released, and no key outside the run's
	// prefix was written.
	prefix := regexp.MustCompile(`keys under "([^"]+)"`).FindStringSubmatch(r.stderr)
	if prefix == nil || !strings.HasPrefix(prefix[1], "locker-bench/") || len(prefix[1]) <= len("locker-bench/") {
		t.Fatalf("stderr does not name the run's key prefix: %s", r.stderr)
	}
	checkBenchKeys(t, e, prefix[1], 5)
}

// checkBenchKeys checks that the lock table holds only keys under prefix
// (cases of them), none held.
func checkBenchKeys(t *testing.T, e *env, prefix string, cases int) {
	t.Helper()
	db, err := sql.Open("sqlite", e.db+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.QueryContext(context.Background(), `SELECT lock_key, owner FROM "`+sqltable.DefaultTable+`"`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var key, owner string
		if err := rows.Scan(&key, &owner); err != nil {
			t.Fatal(err)
		}
		n++
		if !strings.HasPrefix(key, prefix) {
			t.Errorf("bench wrote key %q, outside its prefix %q", key, prefix)
		}
		if owner != "" {
			t.Errorf("key %q is still held after bench", key)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != cases {
		t.Errorf("bench left %d keys, want one per case (%d)", n, cases)
	}
}

func TestBenchSVG(t *testing.T) {
	e := newEnv(t)
	svg := filepath.Join(t.TempDir(), "bench.svg")
	r := e.run("bench", "--ops", "10", "--waiters", "2", "--handoffs", "5", "--clients", "0", "--prefix", "mine/", "--plot", svg)
	r.want(t, 0, "bench --plot .svg")
	rows := parseBenchTable(t, r.stdout)
	if _, ok := rows["handoff/2"]; !ok || len(rows) != 2 {
		t.Errorf("want rows uncontended and handoff/2 only:\n%s", r.stdout)
	}
	data, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(bytes.NewReader(data))
	root := ""
	texts := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("--plot %s is not well-formed XML: %v", svg, err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
			}
			if se.Name.Local == "text" {
				texts++
			}
		}
	}
	if root != "svg" || texts == 0 {
		t.Errorf("--plot %s: root element %q, %d text elements; want an svg with labels", svg, root, texts)
	}
	checkBenchKeys(t, e, "mine/", 2)
}

func TestBenchErrors(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--ops", "0"}, "--ops"},
		{[]string{"--handoffs", "-1"}, "--handoffs"},
		{[]string{"--clients", "1"}, "--clients"},
		{[]string{"--clients", "5000"}, "--clients"},
		{[]string{"--waiters", "0"}, "--waiters"},
		{[]string{"--waiters", "x"}, "--waiters"},
		{[]string{"--duration", "0"}, "--duration"},
		{[]string{"--timeout", "0"}, "--timeout"},
		{[]string{"--ttl", "-1s"}, "--ttl"},
		{[]string{"--prefix", ""}, "--prefix"},
		{[]string{"--plot", filepath.Join(dir, "x.jpg")}, ".png or .svg"},
		{[]string{"--plot", filepath.Join(dir, "missing", "x.png")}, "--plot"},
		{[]string{"--metrics", filepath.Join(dir, "missing", "m.json")}, "--metrics"},
		{[]string{"extra-arg"}, "extra-arg"},
		{[]string{"--url", "nosuch://x"}, "nosuch"},
		{[]string{"--url", "sqlite://" + filepath.Join(dir, "missing", "locks.db")}, "does not exist"},
		// Unreachable: nothing listens on port 1.
		{[]string{"--url", "postgres://u:s3cret@127.0.0.1:1/db"}, "refused"},
		{[]string{"--url", "redis://:s3cret@127.0.0.1:1"}, "refused"},
	} {
		args := append([]string{"bench", "--ops", "1", "--waiters", "1", "--handoffs", "1", "--clients", "0"}, c.args...)
		r := e.run(args...)
		r.want(t, exitFailure, strings.Join(args, " "))
		if !strings.Contains(r.stderr, c.msg) {
			t.Errorf("locker %v: stderr %q does not mention %q", args, r.stderr, c.msg)
		}
		if strings.Contains(r.stderr, "s3cret") {
			t.Errorf("locker %v: stderr echoes the password: %q", args, r.stderr)
		}
		if strings.Count(strings.TrimSpace(r.stderr), "\n") > 1 || (!strings.Contains(r.stderr, "--help") && strings.Contains(strings.TrimSpace(r.stderr), "\n")) {
			t.Errorf("locker %v: want one clear line (and a usage hint at most), got %q", args, r.stderr)
		}
		if r.stdout != "" {
			t.Errorf("locker %v: stdout %q, want nothing", args, r.stdout)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("failed runs left files behind: %v", entries)
	}
}

// TestBenchInterrupt: SIGINT during the run ends it with 128+SIGINT, its
// locks released.
func TestBenchInterrupt(t *testing.T) {
	e := newEnv(t)
	png := filepath.Join(t.TempDir(), "x.png")
	c := e.cmd("bench", "--ops", "5", "--waiters", "", "--clients", "4", "--duration", "1h", "--plot", png)
	var out bytes.Buffer
	c.Stdout = &out
	stderr, err := c.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(stderr)
	var said strings.Builder
	for {
		line, err := rd.ReadString('\n')
		said.WriteString(line)
		if err != nil {
			_ = c.Process.Kill()
			_ = c.Wait()
			t.Fatalf("bench ended before its contended case: %q", said.String())
		}
		if strings.Contains(line, "contended: running for") {
			break
		}
	}
	_ = c.Process.Signal(syscall.SIGINT)
	rest, _ := io.ReadAll(rd)
	said.Write(rest)
	err = c.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 128+int(syscall.SIGINT) {
		t.Errorf("bench after SIGINT: %v, want status %d; stderr %q", err, 128+int(syscall.SIGINT), said.String())
	}
	if !strings.Contains(said.String(), "interrupted") || out.Len() != 0 {
		t.Errorf("bench after SIGINT: stdout %q, stderr %q", out.String(), said.String())
	}
	if entries, _ := os.ReadDir(filepath.Dir(png)); len(entries) != 0 {
		t.Errorf("an interrupted run left files beside its --plot file: %v", entries)
	}
	prefix := regexp.MustCompile(`keys under "([^"]+)"`).FindStringSubmatch(said.String())
	if prefix == nil {
		t.Fatalf("stderr does not name the run's key prefix: %s", said.String())
	}
	checkBenchKeys(t, e, prefix[1], 2)
}

// otelJSON is what --metrics writes: one OpenTelemetry ResourceMetrics per
// case, as the SDK's data model encodes to JSON (the fields read here).
type otelJSON []struct {
	Resource     []otelKV
	ScopeMetrics []struct {
		Scope   struct{ Name string }
		Metrics []struct {
			Name, Unit string
			Data       struct {
				DataPoints []struct {
					Attributes   []otelKV
					Count        uint64  // histograms
					Value        float64 // sums
					BucketCounts []uint64
				}
			}
		}
	}
}

type otelKV struct {
	Key   string
	Value struct{ Value any }
}

func otelAttrs(kvs []otelKV) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[kv.Key] = fmt.Sprint(kv.Value.Value)
	}
	return m
}

// TestBenchMetrics: --metrics writes observe's metrics of every case, and
// they count what the run did: each case's acquisitions are those of its
// table row plus each client's first (which readies its connection) and,
// in the handoff and contended cases, at most one a client after the
// measured phase and the handoff's first (not a handoff); every
// acquisition released, none lost, none held at the end.
func TestBenchMetrics(t *testing.T) {
	e := newEnv(t)
	path := filepath.Join(t.TempDir(), "metrics.json")
	r := e.run(append(benchShort, "--metrics", path)...)
	r.want(t, 0, "bench --metrics")
	rows := parseBenchTable(t, r.stdout)
	if !strings.Contains(r.stderr, "metrics written to "+path) {
		t.Errorf("stderr does not say where the metrics went: %s", r.stderr)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc otelJSON
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("--metrics %s is not the JSON of OpenTelemetry ResourceMetrics: %v", path, err)
	}
	var cases []string
	for _, rm := range doc {
		res := otelAttrs(rm.Resource)
		name := res["locker.bench.case"]
		cases = append(cases, name)
		row, ok := rows[name]
		if !ok {
			t.Errorf("metrics of case %q, which the table lacks", name)
			continue
		}
		if res["service.name"] != "locker bench" || res["locker.bench.run"] == "" {
			t.Errorf("%s: resource %v, want service.name \"locker bench\" and locker.bench.run", name, res)
		}
		// name, attributes other than backend and family -> count or value
		got := map[string]float64{}
		for _, sm := range rm.ScopeMetrics {
			if sm.Scope.Name != "github.com/go-locker/locker/observe" {
				t.Errorf("%s: scope %q, want observe's", name, sm.Scope.Name)
			}
			for _, m := range sm.Metrics {
				for _, dp := range m.Data.DataPoints {
					a := otelAttrs(dp.Attributes)
					if a["locker.backend"] != "sqlite" || a["locker.family"] != "mutex" {
						t.Errorf("%s: %s %v, want locker.backend sqlite, locker.family mutex", name, m.Name, a)
					}
					delete(a, "locker.backend")
					delete(a, "locker.family")
					k := m.Name + fmt.Sprint(a)
					if dp.BucketCounts != nil {
						got[k] = float64(dp.Count)
					} else {
						got[k] = dp.Value
					}
				}
			}
		}
		acquired := got["locker.acquire.duration"+fmt.Sprint(map[string]string{"locker.operation": "acquire", "locker.outcome": "acquired"})]
		lo, hi := float64(row.ops+row.clients), float64(row.ops+row.clients)
		switch {
		case strings.HasPrefix(name, "handoff/"):
			lo, hi = lo+1, hi+1+float64(row.clients)
		case strings.HasPrefix(name, "contended/"):
			hi += float64(row.clients)
		}
		if acquired < lo || acquired > hi {
			t.Errorf("%s: %v acquisitions recorded; the table counts %d ops of %d clients: want %v to %v", name, acquired, row.ops, row.clients, lo, hi)
		}
		for k, want := range map[string]float64{
			"locker.releases" + fmt.Sprint(map[string]string{"locker.outcome": "released"}):  acquired,
			"locker.hold.duration" + fmt.Sprint(map[string]string{"locker.end": "released"}): acquired,
			"locker.held" + fmt.Sprint(map[string]string{}):                                  0,
			"locker.waiting" + fmt.Sprint(map[string]string{}):                               0,
		} {
			if v, ok := got[k]; !ok || v != want {
				t.Errorf("%s: %s = %v (recorded: %v), want %v", name, k, v, ok, want)
			}
		}
		for k, v := range got {
			if strings.HasPrefix(k, "locker.losses") || (strings.HasPrefix(k, "locker.releases") && !strings.Contains(k, "released")) {
				t.Errorf("%s: %s = %v: no lock was lost or released twice", name, k, v)
			}
			if strings.HasPrefix(k, "locker.acquire.duration") && !strings.Contains(k, ":acquired") &&
				!(strings.HasPrefix(name, "contended/") && strings.Contains(k, ":ctx_ended")) {
				t.Errorf("%s: %s = %v: want only acquisitions (and, contended, those the end of its --duration ended)", name, k, v)
			}
		}
	}
	if want := []string{"uncontended", "handoff/1", "handoff/8", "handoff/64", "contended/4"}; !slices.Equal(cases, want) {
		t.Errorf("--metrics has the cases %v, want %v", cases, want)
	}
	if u := rows["uncontended"]; u.ops != 20 {
		t.Errorf("uncontended: %d ops, want 20", u.ops)
	}
}
