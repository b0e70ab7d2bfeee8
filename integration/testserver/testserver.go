// Package testserver gives tests real servers (Redis, PostgreSQL, MySQL/MariaDB,
// ZooKeeper, etcd) and a network fault proxy.
//
// Each server comes from, in order:
//
//  1. an environment variable naming an existing server (LOCKER_TEST_REDIS_ADDR,
//     LOCKER_TEST_REDIS_NODES, LOCKER_TEST_REDIS_CLUSTER, LOCKER_TEST_POSTGRES_DSN,
//     LOCKER_TEST_MYSQL_DSN, LOCKER_TEST_ZOOKEEPER_ADDR, LOCKER_TEST_ETCD_ADDR), used as is;
//  2. a Docker engine that answers, through testcontainers-go, with the image profile
//     LOCKER_TEST_IMAGES: "official" (upstream images, ports published on 127.0.0.1) or
//     "local" (images built by scripts/docker-up.sh from build/docker, host networking,
//     every server on 127.0.0.1 on a free port);
//  3. nothing: the test is skipped, or fails when LOCKER_REQUIRE_SERVERS=1.
//
// PostgresTLS and MySQLTLS return servers that take TCP connections only over TLS, with
// a certificate from a test CA made at their start (Server.TLS); they always run in a
// container, in both image profiles.
//
// Redis, Postgres, MySQL, ZooKeeper, Etcd, RedisNodes and RedisCluster return servers
// shared by all tests of the test binary (tests isolate themselves by key); NewRedis and
// NewPostgres return private servers that a test may stop, kill or pause. Call Main from
// TestMain so the shared containers are removed when the binary ends; containers left
// by a crashed binary are removed by the next test binary that starts one, and by
// `make test`.
package testserver

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
)

// Kinds of server.
const (
	kindRedis        = "redis"
	kindRedisCluster = "redis-cluster"
	kindPostgres     = "postgres"
	kindMySQL        = "mysql"
	kindZooKeeper    = "zookeeper"
	kindEtcd         = "etcd"
)

// Environment variables: those naming existing servers, the image profile, and the
// switch that turns a missing server from a skip into a failure.
const (
	EnvRedisAddr     = "LOCKER_TEST_REDIS_ADDR"
	EnvRedisNodes    = "LOCKER_TEST_REDIS_NODES"
	EnvRedisCluster  = "LOCKER_TEST_REDIS_CLUSTER"
	EnvPostgresDSN   = "LOCKER_TEST_POSTGRES_DSN"
	EnvMySQLDSN      = "LOCKER_TEST_MYSQL_DSN"
	EnvZooKeeperAddr = "LOCKER_TEST_ZOOKEEPER_ADDR"
	EnvEtcdAddr      = "LOCKER_TEST_ETCD_ADDR"
	EnvImages        = "LOCKER_TEST_IMAGES"
	EnvRequire       = "LOCKER_REQUIRE_SERVERS"
)

// startTimeout bounds creating a container (pulling its image, in the official
// profile) and waiting for its first real ping.
const startTimeout = 5 * time.Minute

// opTimeout bounds one control operation on a container (stop, kill, pause, ...).
const opTimeout = time.Minute

// Server is one running server. Its address never changes, also across Stop/Start.
type Server struct {
	kind string
	addr string
	dsn  string
	env  string    // the environment variable it came from, or ""
	tls  *TLSFiles // the test CA and certificate of a TLS server, else nil

	mu  sync.Mutex
	ctr *testcontainers.DockerContainer // nil when it came from an environment variable
	// members lists every Server backed by the same container (a Redis cluster's
	// nodes share one); nil means just this one.
	members []*Server
}

// Addr returns "127.0.0.1:port" of the server (for an environment-provided server, the
// host:port it names).
func (s *Server) Addr() string { return s.addr }

// DSN returns the data source name for a client: for PostgreSQL a URL
// "postgres://user:pass@127.0.0.1:port/db?sslmode=disable", for MySQL a go-sql-driver
// DSN "user:pass@tcp(127.0.0.1:port)/db", for the other kinds the same as Addr.
func (s *Server) DSN() string {
	if s.dsn != "" {
		return s.dsn
	}
	return s.addr
}

// CanControl reports whether Stop, Start, Kill, Pause and Resume work: false when the
// server came from an environment variable (those methods then skip the test).
func (s *Server) CanControl() bool { return s.ctr != nil }

// String describes the server for test logs.
func (s *Server) String() string {
	src := "container"
	if s.env != "" {
		src = s.env
	}
	return fmt.Sprintf("%s at %s (%s)", s.kind, s.addr, src)
}

func (s *Server) control(t testing.TB, op string) {
	t.Helper()
	if s.ctr == nil {
		t.Skipf("testserver: cannot %s %s: it came from %s, and servers named by environment variables are not controlled by the tests; unset %s to let tests start their own container", op, s, s.env, s.env)
	}
}

// Stop stops the server gracefully (SIGTERM, then SIGKILL after 10s). On a Redis
// cluster node it stops the whole cluster, whose nodes share one container.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.control(t, "stop")
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	grace := 10 * time.Second
	if err := s.ctr.Stop(ctx, &grace); err != nil {
		t.Fatalf("testserver: stop %s: %v", s, err)
	}
}

// Start starts a stopped or killed server again on the same address and waits until it
// answers a real ping (for a Redis cluster: until the cluster state is ok). Starting a
// running server only waits for it to answer.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	s.control(t, "start")
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	running, err := containerRunning(ctx, s.ctr)
	if err != nil {
		t.Fatalf("testserver: start %s: %v", s, err)
	}
	if !running {
		if err := s.ctr.Start(ctx); err != nil {
			t.Fatalf("testserver: start %s: %v", s, err)
		}
	}
	for _, m := range s.group() {
		if err := waitReady(ctx, m); err != nil {
			t.Fatalf("testserver: start %s: %v", s, err)
		}
	}
}

// Kill kills the server at once (SIGKILL), as a crash would; Start brings it back.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	s.control(t, "kill")
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := killContainer(ctx, s.ctr); err != nil {
		t.Fatalf("testserver: kill %s: %v", s, err)
	}
}

// Pause freezes every process of the server (docker pause): connections stay open and
// new ones are still accepted by the kernel, but nothing answers until Resume.
func (s *Server) Pause(t testing.TB) {
	t.Helper()
	s.control(t, "pause")
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := pauseContainer(ctx, s.ctr, true); err != nil {
		t.Fatalf("testserver: pause %s: %v", s, err)
	}
}

// Resume thaws a paused server; it answers again at once.
func (s *Server) Resume(t testing.TB) {
	t.Helper()
	s.control(t, "resume")
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := pauseContainer(ctx, s.ctr, false); err != nil {
		t.Fatalf("testserver: resume %s: %v", s, err)
	}
}

func (s *Server) group() []*Server {
	if len(s.members) > 0 {
		return s.members
	}
	return []*Server{s}
}

// required reports whether a missing server fails the test instead of skipping it.
func required() bool {
	v := strings.TrimSpace(os.Getenv(EnvRequire))
	return v != "" && v != "0" && !strings.EqualFold(v, "false")
}

// unavailable skips (or, with LOCKER_REQUIRE_SERVERS=1, fails) a test that needs a
// server none of the sources could give (envVar "": no variable can name one).
func unavailable(t testing.TB, what, envVar string, err error) {
	t.Helper()
	set := ""
	if envVar != "" {
		set = "set " + envVar + " to an existing one, or "
	}
	msg := fmt.Sprintf("testserver: no %s server: %smake a Docker engine available "+
		"(DOCKER_HOST; LOCKER_TEST_IMAGES=official pulls upstream images, =local uses images built by scripts/docker-up.sh; "+
		"`make test` does all of this as root on Debian/Ubuntu)", what, set)
	if err != nil {
		msg += ": " + err.Error()
	}
	if required() {
		t.Fatal(msg + " [" + EnvRequire + " is set, so this fails instead of skipping]")
	}
	t.Skip(msg)
}

// shared holds one lazily started server set per key for the whole test binary.
type shared struct {
	once    sync.Once
	servers []*Server
	err     error
}

var (
	sharedMu  sync.Mutex
	sharedMap = map[string]*shared{}
)

// getShared starts the servers for key once per test binary and returns them to every
// caller; a failure is remembered so later tests fail or skip fast.
func getShared(key string, start func() ([]*Server, error)) ([]*Server, error) {
	sharedMu.Lock()
	sh := sharedMap[key]
	if sh == nil {
		sh = &shared{}
		sharedMap[key] = sh
	}
	sharedMu.Unlock()
	sh.once.Do(func() { sh.servers, sh.err = start() })
	return sh.servers, sh.err
}

// fromEnv returns the value of an environment variable naming a server.
func fromEnv(name string) string { return strings.TrimSpace(os.Getenv(name)) }

// envServer wraps an address or DSN from an environment variable; the same value gives
// the same *Server for the whole test binary.
func envServer(kind, env, value string) *Server {
	servers, _ := getShared("env\x00"+kind+"\x00"+env+"\x00"+value, func() ([]*Server, error) {
		return []*Server{newEnvServer(kind, env, value)}, nil
	})
	return servers[0]
}

func newEnvServer(kind, env, value string) *Server {
	s := &Server{kind: kind, env: env, addr: value}
	switch kind {
	case kindPostgres, kindMySQL:
		s.dsn = value
		s.addr = hostPortFromDSN(kind, value)
	case kindEtcd: // accept the client URL as etcdctl takes it
		v := strings.TrimPrefix(strings.TrimPrefix(value, "http://"), "https://")
		s.addr = strings.TrimSuffix(v, "/")
	}
	return s
}

// envServers returns the servers of a comma-separated host:port list.
func envServers(kind, env, list string) []*Server {
	var out []*Server
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, envServer(kind, env, a))
		}
	}
	return out
}

// Redis returns the Redis server shared by the tests of this binary.
func Redis(t testing.TB) *Server {
	t.Helper()
	return sharedOne(t, kindRedis, EnvRedisAddr)
}

// NewRedis returns a fresh Redis server private to the test, which it may stop, kill or
// pause; it is removed at t.Cleanup. With LOCKER_TEST_REDIS_ADDR set it returns that
// server instead, whose CanControl is false.
func NewRedis(t testing.TB) *Server {
	t.Helper()
	return private(t, kindRedis, EnvRedisAddr)
}

// RedisNodes returns n independent Redis servers (for Redlock), shared by the tests of
// this binary that ask for the same n. LOCKER_TEST_REDIS_NODES (comma-separated
// host:port) supplies them instead; it must name at least n.
func RedisNodes(t testing.TB, n int) []*Server {
	t.Helper()
	if n < 1 {
		t.Fatalf("testserver: RedisNodes(%d): need at least one node", n)
	}
	if v := fromEnv(EnvRedisNodes); v != "" {
		out := envServers(kindRedis, EnvRedisNodes, v)
		if len(out) < n {
			unavailable(t, fmt.Sprintf("set of %d redis", n), EnvRedisNodes,
				fmt.Errorf("%s names %d servers, the test needs %d", EnvRedisNodes, len(out), n))
		}
		return out[:n]
	}
	servers, err := getShared(fmt.Sprintf("redis-nodes-%d", n), func() ([]*Server, error) {
		return startMany(kindRedis, n)
	})
	if err != nil {
		unavailable(t, fmt.Sprintf("set of %d redis", n), EnvRedisNodes, err)
	}
	return servers
}

// RedisCluster returns the nodes of a Redis cluster of three masters (cluster mode,
// all 16384 slots assigned, every node on 127.0.0.1), shared by the tests of this
// binary. The nodes run in one container: Stop, Kill, Pause on any node act on all.
// LOCKER_TEST_REDIS_CLUSTER (comma-separated host:port of the masters) supplies an
// existing cluster instead.
func RedisCluster(t testing.TB) []*Server {
	t.Helper()
	if v := fromEnv(EnvRedisCluster); v != "" {
		return envServers(kindRedis, EnvRedisCluster, v)
	}
	if v := inherited(EnvRedisCluster); v != "" {
		return envServers(kindRedis, inheritVar(EnvRedisCluster), v)
	}
	servers, err := getShared(kindRedisCluster, func() ([]*Server, error) {
		ss, err := startRedisCluster()
		if err == nil {
			addrs := make([]string, len(ss))
			for i, s := range ss {
				addrs[i] = s.Addr()
			}
			publish(EnvRedisCluster, strings.Join(addrs, ","))
		}
		return ss, err
	})
	if err != nil {
		unavailable(t, "redis cluster", EnvRedisCluster, err)
	}
	return servers
}

// Postgres returns the PostgreSQL server shared by the tests of this binary.
func Postgres(t testing.TB) *Server {
	t.Helper()
	return sharedOne(t, kindPostgres, EnvPostgresDSN)
}

// NewPostgres returns a fresh PostgreSQL server private to the test, removed at
// t.Cleanup (or the LOCKER_TEST_POSTGRES_DSN server, whose CanControl is false).
func NewPostgres(t testing.TB) *Server {
	t.Helper()
	return private(t, kindPostgres, EnvPostgresDSN)
}

// MySQL returns the MySQL-protocol (MariaDB) server shared by the tests of this binary.
func MySQL(t testing.TB) *Server {
	t.Helper()
	return sharedOne(t, kindMySQL, EnvMySQLDSN)
}

// NewMySQL returns a fresh MySQL-protocol (MariaDB) server private to the test,
// removed at t.Cleanup (or the LOCKER_TEST_MYSQL_DSN server, whose CanControl is false).
func NewMySQL(t testing.TB) *Server {
	t.Helper()
	return private(t, kindMySQL, EnvMySQLDSN)
}

// ZooKeeper returns the ZooKeeper server shared by the tests of this binary.
func ZooKeeper(t testing.TB) *Server {
	t.Helper()
	return sharedOne(t, kindZooKeeper, EnvZooKeeperAddr)
}

// NewZooKeeper returns a fresh ZooKeeper server private to the test,
// removed at t.Cleanup (or the LOCKER_TEST_ZOOKEEPER_ADDR server, whose CanControl is false).
func NewZooKeeper(t testing.TB) *Server {
	t.Helper()
	return private(t, kindZooKeeper, EnvZooKeeperAddr)
}

// NewZooKeeperWith returns a fresh ZooKeeper server private to the test, removed
// at t.Cleanup, whose zoo.cfg has the given lines added ("key=value", e.g.
// "maxSessionTimeout=1600"), on top of the test servers' own (tickTime=500). A
// server named by LOCKER_TEST_ZOOKEEPER_ADDR cannot be configured so: then the
// test is skipped. The server does not say which settings it took; a test
// should check their effect (a granted session timeout, say).
func NewZooKeeperWith(t testing.TB, cfg ...string) *Server {
	t.Helper()
	for _, line := range cfg {
		k, v, ok := strings.Cut(line, "=")
		if !ok || k == "" || v == "" || strings.ContainsAny(line, " \t\r\n") {
			t.Fatalf("testserver: NewZooKeeperWith: bad zoo.cfg line %q (want key=value, no spaces)", line)
		}
	}
	if v := fromEnv(EnvZooKeeperAddr); v != "" {
		t.Skipf("testserver: this test needs a ZooKeeper server with %v in its zoo.cfg; the one %s names cannot be configured by the tests: unset %s to let them start their own", cfg, EnvZooKeeperAddr, EnvZooKeeperAddr)
	}
	s, err := startServerWith(kindZooKeeper, zooCfgExtra(cfg))
	if err != nil {
		unavailable(t, kindZooKeeper, EnvZooKeeperAddr, err)
	}
	t.Cleanup(func() { terminate(s) })
	return s
}

// Etcd returns the etcd server shared by the tests of this binary; Addr is the
// host:port of its client URL (http://Addr).
func Etcd(t testing.TB) *Server {
	t.Helper()
	return sharedOne(t, kindEtcd, EnvEtcdAddr)
}

// NewEtcd returns a fresh etcd server private to the test,
// removed at t.Cleanup (or the LOCKER_TEST_ETCD_ADDR server, whose CanControl is false).
func NewEtcd(t testing.TB) *Server {
	t.Helper()
	return private(t, kindEtcd, EnvEtcdAddr)
}

// sharedOne returns the server named by envVar, else the one container of
// kind shared by the tests of this binary.
func sharedOne(t testing.TB, kind, envVar string) *Server {
	t.Helper()
	if v := fromEnv(envVar); v != "" {
		return envServer(kind, envVar, v)
	}
	if v := inherited(envVar); v != "" {
		return envServer(kind, inheritVar(envVar), v)
	}
	servers, err := getShared(kind, func() ([]*Server, error) {
		s, err := startServer(kind)
		if err != nil {
			return nil, err
		}
		publish(envVar, s.DSN())
		return []*Server{s}, nil
	})
	if err != nil {
		unavailable(t, kind, envVar, err)
	}
	return servers[0]
}

// inheritVar is the variable through which a test binary hands the shared
// server of envVar's kind to the child processes it starts (the test binary
// run again, as conformance's Process cases do), so that they use the
// parent's server instead of starting their own. Only the shared servers are
// handed on; a test's private server stays its own.
func inheritVar(envVar string) string { return envVar + "_INHERITED" }

// publishedHere records the variables this process published itself: it uses
// its own shared servers, not what it handed to its children.
var publishedHere sync.Map

// publish puts a shared server's address into this process's environment,
// for its children (see inheritVar).
func publish(envVar, value string) {
	if fromEnv(inheritVar(envVar)) == "" {
		publishedHere.Store(envVar, true)
		_ = os.Setenv(inheritVar(envVar), value)
	}
}

// inherited returns the server a parent test process handed down for
// envVar, or "" when there is none or this process published it itself.
func inherited(envVar string) string {
	if _, ok := publishedHere.Load(envVar); ok {
		return ""
	}
	return fromEnv(inheritVar(envVar))
}

// private returns the server named by envVar (whose CanControl is false),
// else a new container of kind for this test alone, removed at t.Cleanup.
func private(t testing.TB, kind, envVar string) *Server {
	t.Helper()
	if v := fromEnv(envVar); v != "" {
		return envServer(kind, envVar, v)
	}
	s, err := startServer(kind)
	if err != nil {
		unavailable(t, kind, envVar, err)
	}
	t.Cleanup(func() { terminate(s) })
	return s
}

func startMany(kind string, n int) ([]*Server, error) {
	out := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = startServer(kind)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			for _, s := range out {
				if s != nil {
					terminate(s)
				}
			}
			return nil, fmt.Errorf("node %d of %d: %w", i+1, n, err)
		}
	}
	return out, nil
}

// SecurityCases are the conformance areas the second runs of a backend's
// suite make over TLS and as a least-privileged user (Harness.Only): every
// kind of statement or request the Locker sends (acquire, try, release,
// renewal, waits and their wake-ups, fencing, inspection, the families,
// a loss), without the areas that test the Locker's own logic again at
// length. LOCKER_CONFORMANCE_FULL=1 runs the whole suite.
var SecurityCases = []string{"Acquire", "TryAcquire", "Release", "Fencing", "Waiters", "Inspect", "Semaphore", "RW", "Loss"}
