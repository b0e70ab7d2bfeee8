package portability

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"

	_ "github.com/go-locker/locker/etcd"
	_ "github.com/go-locker/locker/postgres"
	_ "github.com/go-locker/locker/redis"
	_ "github.com/go-locker/locker/redis/redlock"
	_ "github.com/go-locker/locker/sqltable/mysql"
	_ "github.com/go-locker/locker/sqltable/pgx"
	_ "github.com/go-locker/locker/sqltable/sqlite"
	_ "github.com/go-locker/locker/zookeeper"
)

// What every run asks of the program: rounds per process, and the TTL the
// program asks for (locker.WithTTL(5*time.Second), written in its source).
const (
	rounds = 20
	ttl    = 5 * time.Second
)

// target is one backend URL form of the README.
type target struct {
	name string
	url  func(t *testing.T) string
	// lease is what the backend gives for the 5s asked (Handle.TTL): the
	// TTL itself on every backend here. etcd counts whole seconds (5s is
	// one) and grants at least its minimum lease, 2s; the test ZooKeeper's
	// tickTime=500ms grants sessions of 1s to 10s.
	lease time.Duration
	// inProcess: mem:// stores live in one process, so the program runs
	// once with two workers, each with a Locker of its own, in place of two
	// processes.
	inProcess bool
}

var targets = []target{
	{name: "memlock", url: func(t *testing.T) string { return "mem://portability" }, lease: ttl, inProcess: true},
	{name: "redis", url: func(t *testing.T) string { return "redis://" + testserver.Redis(t).Addr() }, lease: ttl},
	{name: "redis-cluster", url: clusterURL, lease: ttl},
	{name: "redis-sentinel", url: sentinelURL, lease: ttl},
	{name: "redlock", url: redlockURL, lease: ttl},
	// PostgreSQL reports the TTL asked but does not enforce it yet: an
	// advisory lock lasts as long as its session (being changed, issue 29).
	{name: "postgres", url: func(t *testing.T) string { return testserver.Postgres(t).DSN() }, lease: ttl},
	{name: "zookeeper", url: func(t *testing.T) string { return "zookeeper://" + testserver.ZooKeeper(t).Addr() + "/portability" }, lease: ttl},
	{name: "etcd", url: func(t *testing.T) string { return "etcd://" + testserver.Etcd(t).Addr() + "/portability" }, lease: ttl},
	{name: "postgres+table", url: pgTableURL, lease: ttl},
	{name: "mysql", url: mysqlURL, lease: ttl},
	{name: "sqlite", url: func(t *testing.T) string { return "sqlite://" + filepath.Join(t.TempDir(), "locks.db") }, lease: ttl},
}

// TestPortable builds examples/portable once and runs it unchanged, as two
// processes at once, on every backend URL form of the README. The test
// holds the key itself while both start, so that each one's first TryDo
// meets a key another process holds and must end with ErrNotAcquired; then
// it lets go and the two contend for the rest of their rounds. It checks
// the shared file both wrote while holding the lock (every "enter" followed
// by the same holder's "exit": never two holders at once; tokens strictly
// rising in the order they held, above the test's own), and what each
// printed per round (every round held once, via a wait exactly when its
// TryDo said busy, with the lease the backend gives for 5s). Its first
// subtest shows that these checks catch two processes that do not share
// their locks.
func TestPortable(t *testing.T) {
	bin := buildPortable(t)
	t.Run("ChecksCatchUnsharedLocks", func(t *testing.T) { checksCatchUnsharedLocks(t, bin) })
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			u := tg.url(t)
			start := time.Now()
			r, err := runTwo(t, bin, u, tg.inProcess, !tg.inProcess)
			if err != nil {
				t.Fatal(err)
			}
			if t.Failed() {
				return
			}
			r.check(t, tg.lease)
			if t.Failed() {
				return
			}
			t.Logf("%s: %d rounds by %d workers in %v (contended part %v), %d TryDo busy, tokens %d..%d, lease %s",
				tg.name, r.rounds(), len(r.workers()), time.Since(start).Round(time.Millisecond),
				r.contended.Round(time.Millisecond), r.busy(), r.order[0].token, r.order[len(r.order)-1].token, r.held[0].lease)
		})
	}
}

// buildPortable builds examples/portable in the library's module, with the
// race detector when this test has it, and returns the binary's path.
func buildPortable(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	root, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/go-locker/locker").Output()
	if err != nil {
		t.Fatalf("go list -m github.com/go-locker/locker: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "portable")
	args := []string{"build", "-o", bin}
	if raceEnabled() {
		args = append(args, "-race")
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "./examples/portable")...)
	cmd.Dir = strings.TrimSpace(string(root))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(cmd.Args[1:], " "), cmd.Dir, err, out)
	}
	return bin
}

func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	return ok && slices.Contains(bi.Settings, debug.BuildSetting{Key: "-race", Value: "true"})
}

// run is what two runs of the program left: the lines they printed and the
// shared file's lines, in order.
type run struct {
	hold      bool          // the test held the key while the processes started
	holdToken int64         // the token of the test's own hold
	contended time.Duration // from the test's release to the last exit
	held      []heldLine    // every "held" line, in each worker's order
	busyLines []string      // every "busy" line
	order     []holding     // the shared file: who held, in order
}

type heldLine struct {
	worker string
	round  int
	token  int64
	lease  time.Duration
	via    string
	busy   bool // a "busy" line of the same round came before
}

type holding struct {
	worker string
	token  int64
}

func (r *run) rounds() int { return len(r.held) }
func (r *run) busy() int   { return len(r.busyLines) }
func (r *run) workers() []string {
	var ws []string
	for _, h := range r.held {
		if !slices.Contains(ws, h.worker) {
			ws = append(ws, h.worker)
		}
	}
	return ws
}

// proc is one running program.
type proc struct {
	cmd    *exec.Cmd
	lines  chan string // its stdout, closed at its end
	stdout []string
	stderr bytes.Buffer
	waited bool
}

// runTwo runs the program twice at once on u (once with two workers when
// inProcess), each for rounds rounds on one key, and returns what they
// left, or why their output or the shared file cannot be read. With hold,
// the test holds the key while they start. Every process must exit 0.
func runTwo(t *testing.T, bin, u string, inProcess, hold bool) (*run, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	key := fmt.Sprintf("portability/%s/%d", t.Name(), time.Now().UnixNano())
	shared := filepath.Join(t.TempDir(), "shared.log")
	r := &run{hold: hold}

	// The test holds the key while the processes start: each one's first
	// TryDo then meets a key another process holds.
	var held locker.Handle
	if hold {
		l, err := locker.Open(ctx, u)
		if err != nil {
			t.Fatalf("the test's own locker.Open(%q): %v", u, err)
		}
		defer l.Close()
		if held, err = l.TryAcquire(ctx, key); err != nil {
			t.Fatalf("the test's own hold on %q: %v", key, err)
		}
		r.holdToken = held.Token()
	}

	var procs []*proc
	for range 2 {
		args := []string{"-key", key, "-file", shared, "-rounds", strconv.Itoa(rounds)}
		if inProcess {
			args = append(args, "-workers", "2")
		}
		p := &proc{cmd: exec.CommandContext(ctx, bin, args...), lines: make(chan string, 4*rounds)}
		p.cmd.Env = append(os.Environ(), "LOCKER_URL="+u)
		p.cmd.Stderr = &p.stderr
		stdout, err := p.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			defer close(p.lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				p.lines <- sc.Text()
			}
		}()
		procs = append(procs, p)
		defer func() { // a process left by a failure: end it
			if !p.waited {
				cancel()
				for range p.lines {
				}
				_ = p.cmd.Wait()
			}
		}()
		if inProcess {
			break
		}
	}
	// wait ends p: its output to the end, then its exit.
	wait := func(p *proc) {
		p.waited = true
		for line := range p.lines {
			p.stdout = append(p.stdout, line)
		}
		if err := p.cmd.Wait(); err != nil {
			t.Errorf("%s (LOCKER_URL=%s): %v\nstderr:\n%s\nstdout:\n%s", p.cmd, u, err, p.stderr.String(), strings.Join(p.stdout, "\n"))
		}
	}

	if held != nil {
		// Both must have met the held key before the test lets it go.
		for _, p := range procs {
			busy := fmt.Sprintf("worker=%d.0 round=1 busy", p.cmd.Process.Pid)
			for !slices.Contains(p.stdout, busy) {
				line, ok := <-p.lines
				if !ok {
					wait(p)
					t.Fatalf("process %d ended without reporting its first TryDo busy while the test held the key (%q)", p.cmd.Process.Pid, busy)
				}
				p.stdout = append(p.stdout, line)
			}
		}
		if err := held.Err(); err != nil {
			t.Fatalf("the test's own hold ended while both processes waited: %v", err)
		}
		if err := held.Release(ctx); err != nil {
			t.Fatalf("the test's own release: %v", err)
		}
	}
	released := time.Now()
	for _, p := range procs {
		wait(p)
	}
	r.contended = time.Since(released)
	if t.Failed() {
		return r, nil
	}

	var out []string
	for _, p := range procs {
		out = append(out, p.stdout...)
	}
	var err error
	if r.held, r.busyLines, err = parseOutput(out); err != nil {
		return r, err
	}
	data, err := os.ReadFile(shared)
	if err != nil {
		t.Fatal(err)
	}
	r.order, err = parseShared(string(data))
	return r, err
}

// parseOutput reads the program's lines:
//
//	worker=W round=N busy
//	worker=W round=N held token=T lease=L via=try|wait
func parseOutput(lines []string) (held []heldLine, busy []string, err error) {
	busyRound := map[string]int{} // worker -> round of its last busy line
	for _, line := range lines {
		f := map[string]string{}
		var event string
		for _, w := range strings.Fields(line) {
			if k, v, ok := strings.Cut(w, "="); ok {
				f[k] = v
			} else {
				event = w
			}
		}
		round, rerr := strconv.Atoi(f["round"])
		if f["worker"] == "" || rerr != nil {
			return nil, nil, fmt.Errorf("unexpected line %q", line)
		}
		switch event {
		case "busy":
			busy = append(busy, line)
			busyRound[f["worker"]] = round
		case "held":
			token, terr := strconv.ParseInt(f["token"], 10, 64)
			lease, lerr := time.ParseDuration(f["lease"])
			if terr != nil || lerr != nil {
				return nil, nil, fmt.Errorf("unexpected line %q", line)
			}
			held = append(held, heldLine{worker: f["worker"], round: round, token: token, lease: lease,
				via: f["via"], busy: busyRound[f["worker"]] == round})
		default:
			return nil, nil, fmt.Errorf("unexpected line %q", line)
		}
	}
	return held, busy, nil
}

// parseShared reads the shared file: "enter W T" and "exit W T" lines, each
// written by a holder while it held the lock.
func parseShared(data string) ([]holding, error) {
	var order []holding
	var open *holding // the holder whose "exit" is due
	for i, line := range strings.Split(strings.TrimSuffix(data, "\n"), "\n") {
		f := strings.Fields(line)
		var token int64
		var err error
		if len(f) == 3 {
			token, err = strconv.ParseInt(f[2], 10, 64)
		}
		if len(f) != 3 || err != nil || (f[0] != "enter" && f[0] != "exit") {
			return nil, fmt.Errorf("shared file, line %d: unexpected %q", i+1, line)
		}
		h := holding{worker: f[1], token: token}
		switch {
		case f[0] == "enter" && open != nil:
			return nil, fmt.Errorf("shared file, line %d: two holders at once: %s (token %d) entered while %s (token %d) held the lock",
				i+1, h.worker, h.token, open.worker, open.token)
		case f[0] == "enter":
			order = append(order, h)
			open = &order[len(order)-1]
		case open == nil:
			return nil, fmt.Errorf("shared file, line %d: %q while nobody held the lock", i+1, line)
		case *open != h:
			return nil, fmt.Errorf("shared file, line %d: %q is not the exit of %s (token %d), who held the lock", i+1, line, open.worker, open.token)
		default:
			open = nil
		}
	}
	if open != nil {
		return nil, fmt.Errorf("shared file: %s (token %d) never exited", open.worker, open.token)
	}
	return order, nil
}

// check holds r to the contract: every round of every worker held once,
// tokens strictly rising in the order the lock was held (and above the
// test's own hold), the held rounds the same in the output and the shared
// file, ErrNotAcquired (a busy line) met on a held key, and the lease want
// on every handle.
func (r *run) check(t *testing.T, want time.Duration) {
	t.Helper()
	for _, e := range r.problems(want) {
		t.Error(e)
	}
}

func (r *run) problems(want time.Duration) []string {
	var errs []string
	workers := r.workers()
	if len(workers) != 2 {
		errs = append(errs, fmt.Sprintf("%d workers held the lock (%v), want 2", len(workers), workers))
	}
	next := map[string]int{}
	for _, h := range r.held {
		if next[h.worker]++; h.round != next[h.worker] {
			errs = append(errs, fmt.Sprintf("worker %s held round %d after %d rounds", h.worker, h.round, next[h.worker]-1))
		}
		if wantVia := map[bool]string{true: "wait", false: "try"}[h.busy]; h.via != wantVia {
			errs = append(errs, fmt.Sprintf("worker %s round %d: held via %s, want via %s (busy line before it: %v)", h.worker, h.round, h.via, wantVia, h.busy))
		}
		if h.lease != want {
			errs = append(errs, fmt.Sprintf("worker %s round %d: lease %v reported for %v asked, want %v", h.worker, h.round, h.lease, ttl, want))
		}
	}
	for _, w := range workers {
		if next[w] != rounds {
			errs = append(errs, fmt.Sprintf("worker %s held %d rounds, want %d", w, next[w], rounds))
		}
	}
	// Each process met the test's hold in its first round. Without the
	// hold (both workers in one process) there is only their contention.
	if r.hold {
		for _, w := range workers {
			if !slices.ContainsFunc(r.held, func(h heldLine) bool { return h.worker == w && h.round == 1 && h.busy }) {
				errs = append(errs, fmt.Sprintf("worker %s: round 1 did not report the key the test held as busy", w))
			}
		}
	} else if len(r.busyLines) == 0 {
		errs = append(errs, "no TryDo of two contending workers ever met the key held")
	}
	last := r.holdToken
	for i, h := range r.order {
		if h.token <= last {
			errs = append(errs, fmt.Sprintf("holding %d (%s): token %d after %d, want strictly higher", i+1, h.worker, h.token, last))
		}
		last = h.token
	}
	var fromOutput []holding
	for _, h := range r.held {
		fromOutput = append(fromOutput, holding{h.worker, h.token})
	}
	sorted := func(hs []holding) []holding {
		return slices.SortedFunc(slices.Values(hs), func(a, b holding) int {
			return strings.Compare(fmt.Sprint(a), fmt.Sprint(b))
		})
	}
	if !slices.Equal(sorted(fromOutput), sorted(r.order)) {
		errs = append(errs, fmt.Sprintf("the rounds held in the output (%d) are not those in the shared file (%d)", len(fromOutput), len(r.order)))
	}
	return errs
}

// checksCatchUnsharedLocks runs the program as two processes on mem://,
// whose store each process has to itself: both "hold" the key at once and
// their tokens start over, which the checks of TestPortable must catch
// (two holders in the shared file, or tokens that do not rise).
func checksCatchUnsharedLocks(t *testing.T, bin string) {
	r, err := runTwo(t, bin, "mem://portability", false, false)
	switch {
	case t.Failed():
	case err != nil && strings.Contains(err.Error(), "two holders at once"):
		t.Logf("caught: %v", err)
	case err != nil:
		t.Fatalf("unexpected: %v", err)
	default:
		errs := r.problems(ttl)
		if !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, "want strictly higher") }) {
			t.Fatalf("two processes with a store each passed the checks: %v", errs)
		}
		t.Logf("caught: %v", errs)
	}
}

// TestChecks feeds the checks above with what broken lockers would leave,
// so that a passing TestPortable means something.
func TestChecks(t *testing.T) {
	for name, data := range map[string]string{
		"overlap":      "enter a.0 1\nenter b.0 2\nexit a.0 1\nexit b.0 2\n",
		"foreign exit": "enter a.0 1\nexit b.0 1\n",
		"no exit":      "enter a.0 1\n",
	} {
		if _, err := parseShared(data); err == nil {
			t.Errorf("parseShared accepted a shared file with %s", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	good := func() *run {
		r := &run{hold: true, holdToken: 1}
		for i := range 2 * rounds {
			w, round := fmt.Sprintf("%c.0", 'a'+i%2), i/2+1
			h := heldLine{worker: w, round: round, token: int64(10 + i), lease: ttl, via: "try"}
			if round == 1 {
				h.busy, h.via = true, "wait"
				r.busyLines = append(r.busyLines, w+" busy")
			}
			r.held = append(r.held, h)
			r.order = append(r.order, holding{w, h.token})
		}
		return r
	}
	if errs := good().problems(ttl); len(errs) > 0 {
		t.Fatalf("a good run has problems: %v", errs)
	}
	for name, spoil := range map[string]func(r *run){
		"tokens falling":       func(r *run) { r.order[3].token, r.held[3].token = 5, 5 },
		"token of the hold":    func(r *run) { r.holdToken = 10 },
		"wrong lease":          func(r *run) { r.held[7].lease = 10 * time.Second },
		"round missing":        func(r *run) { r.held = r.held[:len(r.held)-1] },
		"first TryDo not busy": func(r *run) { r.held[0].busy, r.held[0].via = false, "try" },
		"file and output":      func(r *run) { r.order[4].worker = "c.0" },
		"one worker":           func(r *run) { r.held = r.held[:1] },
	} {
		r := good()
		spoil(r)
		if errs := r.problems(ttl); len(errs) == 0 {
			t.Errorf("%s: no problem found", name)
		} else {
			t.Logf("%s: %v", name, errs)
		}
	}
	if _, _, err := parseOutput([]string{"worker=a.0 round=1 failed"}); err == nil {
		t.Error("parseOutput accepted an unknown line")
	}
}

// clusterURL is redis+cluster:// with every master of the test cluster.
func clusterURL(t *testing.T) string {
	var addrs []string
	for _, s := range testserver.RedisCluster(t) {
		addrs = append(addrs, s.Addr())
	}
	return "redis+cluster://" + addrs[0] + "?" + url.Values{"addr": addrs[1:]}.Encode()
}

// redlockURL is redlock:// over three independent Redis servers.
func redlockURL(t *testing.T) string {
	var addrs []string
	for _, s := range testserver.RedisNodes(t, 3) {
		addrs = append(addrs, s.Addr())
	}
	return "redlock://" + strings.Join(addrs, ",")
}

// pgTableURL is postgres+table:// on the test PostgreSQL server.
func pgTableURL(t *testing.T) string {
	u, err := url.Parse(testserver.Postgres(t).DSN())
	if err != nil {
		t.Fatal(err)
	}
	u.Scheme = "postgres+table"
	return u.String()
}

// mysqlURL is mysql:// on the test MariaDB server, from its go-sql-driver
// DSN user:pass@tcp(addr)/db.
func mysqlURL(t *testing.T) string {
	srv := testserver.MySQL(t)
	cred, rest, _ := strings.Cut(srv.DSN(), "@")
	user, pass, _ := strings.Cut(cred, ":")
	_, db, _ := strings.Cut(rest, "/")
	db, _, _ = strings.Cut(db, "?")
	return (&url.URL{Scheme: "mysql", User: url.UserPassword(user, pass), Host: srv.Addr(), Path: "/" + db}).String()
}

// sentinelURL is redis+sentinel:// through a Sentinel that monitors the
// test Redis server. integration/testserver has no Sentinel, so the test
// starts one from the redis-server binary on PATH, as integration/redis's
// TestURLSentinel does, and skips without it.
func sentinelURL(t *testing.T) string {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("integration/testserver has no Redis Sentinel, and there is no redis-server binary on PATH to start one: install redis-server to run this case")
	}
	master := testserver.Redis(t)
	host, port, err := net.SplitHostPort(master.Addr())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_, sport, _ := net.SplitHostPort(addr)
	ln.Close()
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, "bind 127.0.0.1\nport %s\ndir %s\nsentinel monitor portability %s %s 1\n",
		sport, dir, host, port), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })

	// Ready when it names the master (no signal to wait for: poll).
	c := goredis.NewSentinelClient(&goredis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		got, err := c.GetMasterAddrByName(ctx, "portability").Result()
		if err == nil && len(got) == 2 && net.JoinHostPort(got[0], got[1]) == master.Addr() {
			break
		}
		select {
		case err2 := <-exited:
			exited <- err2
			t.Fatalf("redis-server --sentinel exited: %v\n%s", err2, log.String())
		case <-ctx.Done():
			t.Fatalf("the Sentinel at %s does not name the master %s: %v %v", addr, master.Addr(), got, errors.Join(err, ctx.Err()))
		case <-time.After(20 * time.Millisecond):
		}
	}
	return "redis+sentinel://" + addr + "?master_name=portability"
}
