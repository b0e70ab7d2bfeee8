package testserver_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker/integration/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

func ctxFor(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func redisClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	// ContextTimeoutEnabled: without it go-redis ignores context deadlines and waits
	// for its own read timeout.
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 2 * time.Second, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func redisRoundTrip(ctx context.Context, c *redis.Client, key string) error {
	if err := c.Set(ctx, key, "v-"+key, time.Minute).Err(); err != nil {
		return err
	}
	got, err := c.Get(ctx, key).Result()
	if err != nil {
		return err
	}
	if got != "v-"+key {
		return fmt.Errorf("GET %s = %q", key, got)
	}
	return nil
}

func TestRedisSmoke(t *testing.T) {
	s := testserver.Redis(t)
	t.Logf("redis: %s", s)
	if err := redisRoundTrip(ctxFor(t, 10*time.Second), redisClient(t, s.Addr()), "smoke:"+t.Name()); err != nil {
		t.Fatal(err)
	}
	if s2 := testserver.Redis(t); s2 != s {
		t.Fatalf("Redis returned a second server %s, want the shared %s", s2, s)
	}
}

// TestCPU: a started server's CPU time, as the benchmarks read it, grows
// with the work it is given.
func TestCPU(t *testing.T) {
	s := testserver.Redis(t)
	ctx := ctxFor(t, time.Minute)
	before, err := s.CPU(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := redisClient(t, s.Addr())
	// Work that costs the server milliseconds of CPU whatever the load:
	// SORT of a 10,000-element list, 20 times.
	vals := make([]any, 10000)
	for i := range vals {
		vals[i] = (i * 7919) % 10007
	}
	k := "cpu:" + t.Name()
	if err := c.RPush(ctx, k, vals...).Err(); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if err := c.Sort(ctx, k, &redis.Sort{}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	after, err := s.CPU(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the server's CPU grew by %v", after-before)
	if after-before < time.Millisecond {
		t.Errorf("the server's CPU grew by %v over 20 sorts of 10,000 elements, want at least 1ms", after-before)
	}
}

func TestPostgresSmoke(t *testing.T) {
	s := testserver.Postgres(t)
	ctx := ctxFor(t, 20*time.Second)
	conn, err := pgx.Connect(ctx, s.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS smoke (k text PRIMARY KEY, v text)`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO smoke VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v`, t.Name(), "pg"); err != nil {
		t.Fatal(err)
	}
	var v string
	if err := conn.QueryRow(ctx, `SELECT v FROM smoke WHERE k = $1`, t.Name()).Scan(&v); err != nil || v != "pg" {
		t.Fatalf("read back %q, %v", v, err)
	}
}

func TestMySQLSmoke(t *testing.T) {
	s := testserver.MySQL(t)
	ctx := ctxFor(t, 20*time.Second)
	cfg, err := mysql.ParseDSN(s.DSN())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != s.Addr() {
		t.Fatalf("DSN %q names %q, Addr is %q", s.DSN(), cfg.Addr, s.Addr())
	}
	db, err := sql.Open("mysql", s.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS smoke (k VARCHAR(200) PRIMARY KEY, v TEXT)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `REPLACE INTO smoke VALUES (?, ?)`, t.Name(), "my"); err != nil {
		t.Fatal(err)
	}
	var v string
	if err := db.QueryRowContext(ctx, `SELECT v FROM smoke WHERE k = ?`, t.Name()).Scan(&v); err != nil || v != "my" {
		t.Fatalf("read back %q, %v", v, err)
	}
}

func TestZooKeeperSmoke(t *testing.T) {
	s := testserver.ZooKeeper(t)
	conn, events, err := zk.Connect([]string{s.Addr()}, 5*time.Second, zk.WithLogger(nopLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := ctxFor(t, 20*time.Second)
	for ev := range events {
		if ev.State == zk.StateHasSession {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("no zookeeper session")
		}
	}
	path := "/smoke-" + fmt.Sprint(time.Now().UnixNano())
	if _, err := conn.Create(path, []byte("zk"), zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	data, _, err := conn.Get(path)
	if err != nil || string(data) != "zk" {
		t.Fatalf("read back %q, %v", data, err)
	}
}

func TestEtcdSmoke(t *testing.T) {
	s := testserver.Etcd(t)
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + s.Addr()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := ctxFor(t, 20*time.Second)
	key := "/smoke/" + t.Name()
	if _, err := c.Put(ctx, key, "etcd"); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "etcd" {
		t.Fatalf("read back %v, %v", resp, err)
	}
}

type nopLogger struct{}

func (nopLogger) Printf(string, ...any) {}

func TestRedisNodes(t *testing.T) {
	nodes := testserver.RedisNodes(t, 3)
	if len(nodes) != 3 {
		t.Fatalf("got %d nodes", len(nodes))
	}
	seen := map[string]bool{}
	ctx := ctxFor(t, 20*time.Second)
	for i, n := range nodes {
		if seen[n.Addr()] {
			t.Fatalf("node %d repeats address %s", i, n.Addr())
		}
		seen[n.Addr()] = true
		c := redisClient(t, n.Addr())
		// Independent servers: a key written on one is absent on the others.
		if err := c.Set(ctx, "only-on", n.Addr(), time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		got, err := redisClient(t, n.Addr()).Get(ctx, "only-on").Result()
		if err != nil || got != n.Addr() {
			t.Fatalf("%s: only-on = %q, %v", n.Addr(), got, err)
		}
	}
	if again := testserver.RedisNodes(t, 3); again[0] != nodes[0] {
		t.Fatal("RedisNodes(t, 3) did not return the shared nodes")
	}
}

func TestRedisCluster(t *testing.T) {
	nodes := testserver.RedisCluster(t)
	if len(nodes) != 3 {
		t.Fatalf("got %d nodes", len(nodes))
	}
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.Addr())
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, DialTimeout: 2 * time.Second, ContextTimeoutEnabled: true})
	defer c.Close()
	ctx := ctxFor(t, 20*time.Second)
	// Keys spread over all three masters.
	for i := range 30 {
		if err := redisRoundTripCluster(ctx, c, fmt.Sprintf("k%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	var masters atomic.Int32
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		masters.Add(1)
		host, _, err := net.SplitHostPort(m.Options().Addr)
		if err != nil || host != "127.0.0.1" {
			return fmt.Errorf("master at %q, want 127.0.0.1", m.Options().Addr)
		}
		return nil
	})
	if err != nil || masters.Load() != 3 {
		t.Fatalf("masters: %d, %v", masters.Load(), err)
	}
	// Every node sees three masters with distinct config epochs: with equal
	// ones, a slot moved by a test could be taken back by gossip.
	for _, a := range addrs {
		nc := redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true})
		out, err := nc.ClusterNodes(ctx).Result()
		_ = nc.Close()
		if err != nil {
			t.Fatalf("CLUSTER NODES on %s: %v", a, err)
		}
		epochs := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 8 || !strings.Contains(f[2], "master") {
				continue
			}
			if epochs[f[6]] {
				t.Errorf("%s sees two masters with config epoch %s:\n%s", a, f[6], out)
			}
			epochs[f[6]] = true
		}
		if len(epochs) != 3 {
			t.Errorf("%s sees %d distinct master config epochs, want 3:\n%s", a, len(epochs), out)
		}
	}
}

func redisRoundTripCluster(ctx context.Context, c *redis.ClusterClient, key string) error {
	if err := c.Set(ctx, key, "v-"+key, time.Minute).Err(); err != nil {
		return err
	}
	got, err := c.Get(ctx, key).Result()
	if err != nil || got != "v-"+key {
		return fmt.Errorf("GET %s = %q, %v", key, got, err)
	}
	return nil
}

// --- fault operations ---------------------------------------------------------------

func controllable(t *testing.T, s *testserver.Server) {
	t.Helper()
	if !s.CanControl() {
		t.Skipf("%s cannot be controlled", s)
	}
}

func TestPauseResume(t *testing.T) {
	s := testserver.NewRedis(t)
	controllable(t, s)
	c := redisClient(t, s.Addr())
	if err := c.Ping(ctxFor(t, 5*time.Second)).Err(); err != nil {
		t.Fatal(err)
	}
	s.Pause(t)
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err := c.Ping(short).Err()
	cancel()
	if err == nil {
		t.Fatal("a paused server answered PING")
	}
	if !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
		t.Fatalf("paused server: want a timeout, got %v", err)
	}
	s.Resume(t)
	if err := c.Ping(ctxFor(t, 5*time.Second)).Err(); err != nil {
		t.Fatalf("resumed server: %v", err)
	}
}

func TestStopStartSameAddress(t *testing.T) {
	s := testserver.NewRedis(t)
	controllable(t, s)
	addr := s.Addr()
	c := redisClient(t, addr)
	if err := c.Ping(ctxFor(t, 5*time.Second)).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop(t)
	if err := c.Ping(ctxFor(t, 2*time.Second)).Err(); err == nil {
		t.Fatal("a stopped server answered PING")
	}
	s.Start(t)
	if s.Addr() != addr {
		t.Fatalf("address changed from %s to %s", addr, s.Addr())
	}
	if err := redisRoundTrip(ctxFor(t, 5*time.Second), c, "after-restart"); err != nil {
		t.Fatalf("restarted server: %v", err)
	}
}

func TestKillStart(t *testing.T) {
	s := testserver.NewPostgres(t)
	controllable(t, s)
	ctx := ctxFor(t, 30*time.Second)
	conn, err := pgx.Connect(ctx, s.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	s.Kill(t)
	if err := conn.Ping(ctxFor(t, 2*time.Second)); err == nil {
		t.Fatal("a connection to a killed server still answers")
	}
	s.Start(t)
	conn2, err := pgx.Connect(ctx, s.DSN())
	if err != nil {
		t.Fatalf("after kill and start: %v", err)
	}
	defer conn2.Close(context.Background())
	if err := conn2.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestProxyBlackholeHeal(t *testing.T) {
	s := testserver.Redis(t)
	p := testserver.NewProxy(t, s.Addr())
	c := redisClient(t, p.Addr())
	if err := redisRoundTrip(ctxFor(t, 5*time.Second), c, "via-proxy"); err != nil {
		t.Fatal(err)
	}
	p.Blackhole(t)
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err := c.Ping(short).Err()
	cancel()
	if err == nil {
		t.Fatal("PING passed a blackholed proxy")
	}
	if !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
		t.Fatalf("blackholed: want a timeout, got %v", err)
	}
	// A new connection is accepted but gets no answer either.
	raw, err := net.DialTimeout("tcp", p.Addr(), 2*time.Second)
	if err != nil {
		t.Fatalf("blackholed proxy refused a connection: %v", err)
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := raw.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(raw).ReadString('\n'); !isTimeout(err) {
		t.Fatalf("blackholed raw connection: want a timeout, got %v", err)
	}
	p.Heal(t)
	// The client's old connection may have been dropped by its timeout; go-redis dials
	// a new one, which passes now.
	if err := c.Ping(ctxFor(t, 5*time.Second)).Err(); err != nil {
		t.Fatalf("after heal: %v", err)
	}
}

func TestProxyLatency(t *testing.T) {
	s := testserver.Redis(t)
	p := testserver.NewProxy(t, s.Addr())
	c := redisClient(t, p.Addr())
	ctx := ctxFor(t, 10*time.Second)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const d = 200 * time.Millisecond
	p.Latency(t, d)
	start := time.Now()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < d {
		t.Fatalf("PING took %v through a proxy adding %v", took, d)
	}
	p.Heal(t)
	start = time.Now()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took >= d {
		t.Fatalf("PING took %v after Heal", took)
	}
}

func TestProxyResetAll(t *testing.T) {
	s := testserver.Redis(t)
	p := testserver.NewProxy(t, s.Addr())
	raw, err := net.DialTimeout("tcp", p.Addr(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	r := bufio.NewReader(raw)
	_ = raw.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := raw.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); err != nil || line != "+PONG\r\n" {
		t.Fatalf("PING: %q, %v", line, err)
	}
	p.ResetAll(t)
	_ = raw.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = raw.Write([]byte("PING\r\n"))
	if _, err := r.ReadString('\n'); err == nil || isTimeout(err) {
		t.Fatalf("after ResetAll: want a connection error, got %v", err)
	}
	// New connections pass.
	if err := redisClient(t, p.Addr()).Ping(ctxFor(t, 5*time.Second)).Err(); err != nil {
		t.Fatalf("new connection after ResetAll: %v", err)
	}
}

// Pausing ZooKeeper is how session-expiry tests will use it: a private one pauses
// without disturbing the shared one.
func TestNewZooKeeperPause(t *testing.T) {
	s := testserver.NewZooKeeper(t)
	controllable(t, s)
	if s == testserver.ZooKeeper(t) {
		t.Fatal("NewZooKeeper returned the shared server")
	}
	s.Pause(t)
	conn, err := net.DialTimeout("tcp", s.Addr(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The "srvr" four-letter word gets no answer from a paused server.
	_ = conn.SetDeadline(time.Now().Add(300 * time.Millisecond))
	_, _ = conn.Write([]byte("srvr"))
	if _, err := bufio.NewReader(conn).ReadString('\n'); !isTimeout(err) {
		t.Fatalf("paused zookeeper: want a timeout, got %v", err)
	}
	s.Resume(t)
	c, events, err := zk.Connect([]string{s.Addr()}, 5*time.Second, zk.WithLogger(nopLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := ctxFor(t, 20*time.Second)
	for {
		select {
		case ev := <-events:
			if ev.State == zk.StateHasSession {
				return
			}
		case <-ctx.Done():
			t.Fatal("no session with the resumed zookeeper")
		}
	}
}
