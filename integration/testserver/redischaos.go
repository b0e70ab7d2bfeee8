package testserver

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
)

// NewRedisDurable returns a fresh Redis server private to the test, run the
// way the redis and redlock packages' docs recommend for locks that must
// survive a crash: appendonly yes with appendfsync always, so that every
// lock, renewal and fence counter is on disk before the server replies, and
// a Kill followed by Start brings them all back. The test may stop, kill or
// pause it; it is removed at t.Cleanup. With LOCKER_TEST_REDIS_ADDR set it
// returns that server instead, whose CanControl is false.
func NewRedisDurable(t testing.TB) *Server {
	t.Helper()
	return NewRedisDurableNodes(t, 1)[0]
}

// NewRedisDurableNodes returns n independent private Redis servers
// configured as NewRedisDurable's, started in parallel (Redlock nodes a test
// may pause, kill and restart one by one). With LOCKER_TEST_REDIS_NODES set
// it returns the first n servers it names instead, whose CanControl is false.
func NewRedisDurableNodes(t testing.TB, n int) []*Server {
	t.Helper()
	if n < 1 {
		t.Fatalf("testserver: NewRedisDurableNodes(%d): need at least one node", n)
	}
	if n == 1 {
		if v := fromEnv(EnvRedisAddr); v != "" {
			return []*Server{envServer(kindRedis, EnvRedisAddr, v)}
		}
	}
	if v := fromEnv(EnvRedisNodes); v != "" {
		out := envServers(kindRedis, EnvRedisNodes, v)
		if len(out) < n {
			unavailable(t, fmt.Sprintf("set of %d redis", n), EnvRedisNodes,
				fmt.Errorf("%s names %d servers, the test needs %d", EnvRedisNodes, len(out), n))
		}
		return out[:n]
	}
	out := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = redisDurableStart()
		}()
	}
	wg.Wait()
	for _, s := range out {
		if s != nil {
			t.Cleanup(func() { terminate(s) })
		}
	}
	for i, err := range errs {
		if err != nil {
			unavailable(t, "durable redis", EnvRedisAddr, fmt.Errorf("node %d of %d: %w", i+1, n, err))
		}
	}
	return out
}

// redisDurableStart starts one Redis with AOF and appendfsync always in a
// container of its own, retrying with new ports when it died at once (a
// port taken meanwhile by another process).
func redisDurableStart() (*Server, error) {
	e, err := getEngine()
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 3 {
		ports, err := freePorts(1)
		if err != nil {
			return nil, err
		}
		p := ports[0]
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		durable := []string{"--appendonly", "yes", "--appendfsync", "always", "--save", ""}
		var sp spec
		if e.profile == profileLocal {
			// The image's entry script runs Redis without persistence; run
			// the server directly. Its data directory lives in the
			// container's file system: it survives a kill and a start of
			// the same container, and goes with it.
			sp = spec{image: e.image, entrypoint: []string{"redis-server"}, cmd: append([]string{
				"--bind", "127.0.0.1", "--port", strconv.Itoa(p), "--dir", "/var/lib/redis",
				"--protected-mode", "no", "--daemonize", "no", "--logfile", "",
			}, durable...)}
		} else {
			sp = spec{image: officialImage(kindRedis), cmd: append([]string{"redis-server"}, durable...),
				bind: map[int]string{p: "6379/tcp"}}
		}
		s, err := runServers(e, kindRedis, sp, []*Server{{kind: kindRedis, addr: addr}}, nil)
		if err == nil {
			return s[0], nil
		}
		lastErr = err
		if !isExited(err) {
			return nil, err
		}
	}
	return nil, lastErr
}
