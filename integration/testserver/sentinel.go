package testserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMasterName is the name under which the Sentinels of
// RedisSentinel monitor their master.
const SentinelMasterName = "mymaster"

// Sentinel timings of RedisSentinel: a master that does not answer for
// SentinelDownAfter is subjectively down, and with 2 of the 3 Sentinels
// agreeing a failover starts; SentinelFailoverTimeout also spaces two
// failovers of the group (Sentinel waits twice it before trying again).
const (
	SentinelDownAfter       = time.Second
	SentinelFailoverTimeout = 2 * time.Second
)

// SentinelGroup is a Redis master, one replica and 3 Sentinels (quorum 2),
// each in a container of its own on its own loopback port, private to the
// test that made it. Data are the two Redis servers, the initial master
// first; their roles change with failovers (Master tells which is master
// now). Every server can be killed, paused and started again (Server's
// Kill, Pause, Resume, Start); Rejoin brings a killed data server back as
// a replica.
type SentinelGroup struct {
	Data      []*Server
	Sentinels []*Server
}

// RedisSentinel starts a SentinelGroup for the test; it is removed at
// t.Cleanup. The servers reach each other over the host's loopback, so it
// needs host networking: LOCKER_TEST_IMAGES=local (images built by
// scripts/docker-up.sh); it skips otherwise. The Redis servers keep no
// data on disk (no RDB, no AOF), and sync replicas diskless without delay.
func RedisSentinel(t testing.TB) *SentinelGroup {
	t.Helper()
	e, err := getEngine()
	if err != nil {
		sentinelUnavailable(t, err)
	}
	if e.profile != profileLocal {
		t.Skipf("testserver: a Redis Sentinel group needs host networking: set %s=local", EnvImages)
	}
	g, err := startSentinelGroup(e)
	if err != nil {
		sentinelUnavailable(t, err)
	}
	t.Cleanup(func() {
		for _, s := range append(g.Data, g.Sentinels...) {
			terminate(s)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := g.waitHealthy(ctx); err != nil {
		t.Fatalf("testserver: Sentinel group not healthy: %v", err)
	}
	return g
}

// sentinelUnavailable skips (or, with LOCKER_REQUIRE_SERVERS=1, fails) a
// test whose Sentinel group could not start. No variable names an existing
// group: the tests kill and pause its servers.
func sentinelUnavailable(t testing.TB, err error) {
	t.Helper()
	msg := "testserver: no Redis Sentinel group (it needs a Docker engine and LOCKER_TEST_IMAGES=local): " + err.Error()
	if required() {
		t.Fatal(msg + " [" + EnvRequire + " is set, so this fails instead of skipping]")
	}
	t.Skip(msg)
}

func startSentinelGroup(e *engine) (*SentinelGroup, error) {
	ports, err := freePorts(5)
	if err != nil {
		return nil, err
	}
	g := &SentinelGroup{}
	mk := func(p int, sp spec) (*Server, error) {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		ctr, err := e.runContainer(ctx, kindRedis, sp)
		if err != nil {
			return nil, err
		}
		s := &Server{kind: kindRedis, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), ctr: ctr}
		if err := waitReady(ctx, s); err != nil {
			terminate(s)
			return nil, fmt.Errorf("%s did not become ready: %w: %s", s, err, containerLogs(ctr))
		}
		return s, nil
	}
	fail := func(err error) (*SentinelGroup, error) {
		for _, s := range append(g.Data, g.Sentinels...) {
			terminate(s)
		}
		return nil, err
	}
	master := strconv.Itoa(ports[0])
	for i, p := range ports[:2] {
		cmd := []string{"--bind", "127.0.0.1", "--port", strconv.Itoa(p), "--dir", "/srv", "--save", "", "--appendonly", "no",
			"--protected-mode", "no", "--daemonize", "no", "--logfile", "",
			"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"}
		if i > 0 {
			cmd = append(cmd, "--replicaof", "127.0.0.1", master)
		}
		s, err := mk(p, spec{image: e.image, entrypoint: []string{"redis-server"}, cmd: cmd})
		if err != nil {
			return fail(err)
		}
		g.Data = append(g.Data, s)
	}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	g.Sentinels = make([]*Server, 3)
	for i, p := range ports[2:] {
		conf := fmt.Sprintf(`port %d
bind 127.0.0.1
protected-mode no
daemonize no
dir /srv
sentinel monitor %s 127.0.0.1 %s 2
sentinel down-after-milliseconds %s %d
sentinel failover-timeout %s %d
sentinel parallel-syncs %s 1
`, p, SentinelMasterName, master, SentinelMasterName, SentinelDownAfter.Milliseconds(),
			SentinelMasterName, SentinelFailoverTimeout.Milliseconds(), SentinelMasterName)
		// Sentinel rewrites its configuration file: write it once, keep it
		// across a Start after Kill.
		sh := fmt.Sprintf("mkdir -p /srv && { [ -f /srv/sentinel.conf ] || printf '%%s' '%s' > /srv/sentinel.conf; } && exec redis-server /srv/sentinel.conf --sentinel", conf)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := mk(p, spec{image: e.image, entrypoint: []string{"sh", "-c", sh}})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			g.Sentinels[i] = s
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		var live []*Server
		for _, s := range g.Sentinels {
			if s != nil {
				live = append(live, s)
			}
		}
		g.Sentinels = live
		return fail(err)
	}
	return g, nil
}

// SentinelAddrs returns the Sentinels' addresses, for a failover client.
func (g *SentinelGroup) SentinelAddrs() []string {
	a := make([]string, len(g.Sentinels))
	for i, s := range g.Sentinels {
		a[i] = s.addr
	}
	return a
}

// sentinelClient returns a plain client of s (a data server or a Sentinel).
func sentinelClient(s *Server) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.addr, DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, MaxRetries: -1, PoolSize: 1, ContextTimeoutEnabled: true})
}

// masterAddr asks one Sentinel for the master's address.
func masterAddr(ctx context.Context, s *Server) (string, error) {
	c := sentinelClient(s)
	defer c.Close()
	v, err := c.Do(ctx, "SENTINEL", "get-master-addr-by-name", SentinelMasterName).StringSlice()
	if err != nil {
		return "", err
	}
	if len(v) != 2 {
		return "", fmt.Errorf("SENTINEL get-master-addr-by-name: %v", v)
	}
	return net.JoinHostPort(v[0], v[1]), nil
}

func (g *SentinelGroup) byAddr(addr string) *Server {
	for _, s := range g.Data {
		if s.addr == addr {
			return s
		}
	}
	return nil
}

// Master returns the data server the Sentinels name as master now (every
// Sentinel that answers must name the same one).
func (g *SentinelGroup) Master(t testing.TB) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := g.master(ctx)
	if err != nil {
		t.Fatalf("testserver: Sentinel master: %v", err)
	}
	return m
}

func (g *SentinelGroup) master(ctx context.Context) (*Server, error) {
	var found string
	for _, s := range g.Sentinels {
		a, err := masterAddr(ctx, s)
		if err != nil {
			continue
		}
		if found != "" && a != found {
			return nil, fmt.Errorf("the Sentinels disagree: %s and %s", found, a)
		}
		found = a
	}
	m := g.byAddr(found)
	if m == nil {
		return nil, fmt.Errorf("no Sentinel names a known master (got %q)", found)
	}
	return m, nil
}

// Other returns the data server that is not s.
func (g *SentinelGroup) Other(s *Server) *Server {
	if g.Data[0] == s {
		return g.Data[1]
	}
	return g.Data[0]
}

// WaitFailover waits until a Sentinel names another master than old, and
// that server says it is a master; it returns it.
func (g *SentinelGroup) WaitFailover(t testing.TB, old *Server, timeout time.Duration) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		for _, s := range g.Sentinels {
			a, err := masterAddr(ctx, s)
			if err != nil || a == old.addr {
				continue
			}
			if m := g.byAddr(a); m != nil && role(ctx, m) == "master" {
				return m
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("testserver: no failover away from %s within %v", old, timeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func role(ctx context.Context, s *Server) string {
	c := sentinelClient(s)
	defer c.Close()
	v, err := c.Do(ctx, "ROLE").Slice()
	if err != nil || len(v) == 0 {
		return ""
	}
	r, _ := v[0].(string)
	return r
}

// Rejoin starts s again (after Kill) as a replica of the current master,
// and waits until the group is healthy: every Sentinel names the same
// master, which has s as an online replica, s's link is up, and every
// Sentinel sees s as a replica that is not down and can reach a quorum.
func (g *SentinelGroup) Rejoin(t testing.TB, s *Server) {
	t.Helper()
	s.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Right after a failover the Sentinels may still disagree: WaitFailover
	// returns once one of them names the new master, and the others learn
	// of it from its hello messages (every 2s). Wait until they agree (a CI
	// rehearsal of 31ba7ce failed here: "the Sentinels disagree", when B's
	// acquisition after the failover took 1ms).
	m, err := g.agreedMaster(ctx)
	if err != nil {
		t.Fatalf("testserver: Rejoin %s: %v", s, err)
	}
	c := sentinelClient(s)
	defer c.Close()
	host, port, _ := net.SplitHostPort(m.addr)
	if err := c.Do(ctx, "REPLICAOF", host, port).Err(); err != nil {
		t.Fatalf("testserver: Rejoin %s: REPLICAOF: %v", s, err)
	}
	if err := g.waitHealthy(ctx); err != nil {
		t.Fatalf("testserver: Rejoin %s: %v", s, err)
	}
}

// agreedMaster is master, asked again while the Sentinels disagree or
// name no known master (see retry).
func (g *SentinelGroup) agreedMaster(ctx context.Context) (m *Server, err error) {
	err = retry(ctx, func(ctx context.Context) error {
		m, err = g.master(ctx)
		return err
	})
	return m, err
}

// waitHealthy waits until the group can fail over: see Rejoin.
func (g *SentinelGroup) waitHealthy(ctx context.Context) error { return retry(ctx, g.healthy) }

// retry runs f every 100ms until it returns nil or ctx ends.
func retry(ctx context.Context, f func(context.Context) error) error {
	for {
		last := f(ctx)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (g *SentinelGroup) healthy(ctx context.Context) error {
	m, err := g.master(ctx)
	if err != nil {
		return err
	}
	r := g.Other(m)
	rc := sentinelClient(r)
	defer rc.Close()
	info, err := rc.Info(ctx, "replication").Result()
	if err != nil {
		return fmt.Errorf("replica %s: %w", r, err)
	}
	_, mport, _ := net.SplitHostPort(m.addr)
	if !strings.Contains(info, "role:slave") || !strings.Contains(info, "master_link_status:up") || !strings.Contains(info, "master_port:"+mport+"\r") {
		return fmt.Errorf("replica %s not linked to %s yet", r, m)
	}
	for _, s := range g.Sentinels {
		c := sentinelClient(s)
		reps, err := c.Do(ctx, "SENTINEL", "replicas", SentinelMasterName).Slice()
		if err == nil {
			err = c.Do(ctx, "SENTINEL", "ckquorum", SentinelMasterName).Err()
		}
		c.Close()
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", s, err)
		}
		ok := false
		for _, rep := range reps {
			f := fields(rep)
			if net.JoinHostPort(f["ip"], f["port"]) == r.addr && f["flags"] == "slave" && f["master-link-status"] == "ok" {
				ok = true
			}
		}
		if !ok {
			return fmt.Errorf("sentinel %s does not see %s as a healthy replica yet", s, r)
		}
	}
	return nil
}

// fields reads a Sentinel's description of an instance: a flat list of
// names and values (RESP2) or a map (RESP3).
func fields(v any) map[string]string {
	out := map[string]string{}
	switch x := v.(type) {
	case []any:
		for i := 0; i+1 < len(x); i += 2 {
			out[fmt.Sprint(x[i])] = fmt.Sprint(x[i+1])
		}
	case map[any]any:
		for k, v := range x {
			out[fmt.Sprint(k)] = fmt.Sprint(v)
		}
	}
	return out
}
