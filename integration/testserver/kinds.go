package testserver

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// Upstream images of the official profile; each can be overridden by its variable.
var officialImages = map[string][2]string{
	kindRedis:     {"LOCKER_TEST_REDIS_IMAGE", "redis:7.4-alpine"},
	kindPostgres:  {"LOCKER_TEST_POSTGRES_IMAGE", "postgres:16-alpine"},
	kindMySQL:     {"LOCKER_TEST_MYSQL_IMAGE", "mariadb:11.4"},
	kindZooKeeper: {"LOCKER_TEST_ZOOKEEPER_IMAGE", "zookeeper:3.9"},
	kindEtcd:      {"LOCKER_TEST_ETCD_IMAGE", "quay.io/coreos/etcd:v3.5.17"},
}

func officialImage(kind string) string {
	if kind == kindRedisCluster {
		kind = kindRedis
	}
	iv := officialImages[kind]
	if v := strings.TrimSpace(os.Getenv(iv[0])); v != "" {
		return v
	}
	return iv[1]
}

// Credentials of the SQL servers the containers create.
const (
	dbUser     = "locker"
	dbPassword = "locker"
	dbName     = "locker"
)

// serverSpec returns how to run kind on the two given free host ports, the server's
// address, and its DSN.
func (e *engine) serverSpec(kind string, ports []int) (sp spec, addr, dsn string) {
	p, p2 := ports[0], ports[1]
	addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	switch kind {
	case kindPostgres:
		dsn = fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", dbUser, dbPassword, addr, dbName)
	case kindMySQL:
		dsn = fmt.Sprintf("%s:%s@tcp(%s)/%s", dbUser, dbPassword, addr, dbName)
	}
	if e.profile == profileLocal {
		sp = spec{image: e.image, cmd: []string{kind, strconv.Itoa(p)}}
		if kind == kindEtcd {
			sp.cmd = append(sp.cmd, strconv.Itoa(p2))
		}
		return sp, addr, dsn
	}
	sp = spec{image: officialImage(kind)}
	switch kind {
	case kindRedis:
		sp.cmd = []string{"redis-server", "--save", "", "--appendonly", "no"}
		sp.bind = map[int]string{p: "6379/tcp"}
	case kindPostgres:
		sp.env = map[string]string{"POSTGRES_USER": dbUser, "POSTGRES_PASSWORD": dbPassword, "POSTGRES_DB": dbName}
		sp.cmd = []string{"postgres", "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "max_connections=200"}
		sp.bind = map[int]string{p: "5432/tcp"}
	case kindMySQL:
		sp.env = map[string]string{"MARIADB_USER": dbUser, "MARIADB_PASSWORD": dbPassword, "MARIADB_DATABASE": dbName, "MARIADB_ROOT_PASSWORD": dbPassword}
		sp.cmd = []string{"--innodb-flush-log-at-trx-commit=0", "--skip-log-bin", "--max-connections=300"}
		sp.bind = map[int]string{p: "3306/tcp"}
	case kindZooKeeper:
		// No cap on connections from one address (the official image's is
		// 60; the local image has none): the scale benchmarks open 128.
		sp.env = map[string]string{"ZOO_ADMINSERVER_ENABLED": "false", "ZOO_TICK_TIME": "500", "ZOO_MAX_CLIENT_CNXNS": "0"}
		sp.bind = map[int]string{p: "2181/tcp"}
	case kindEtcd:
		sp.cmd = []string{"etcd", "--name", "locker", "--data-dir", "/tmp/etcd",
			"--listen-client-urls", "http://0.0.0.0:2379", "--advertise-client-urls", "http://" + addr,
			"--log-level", "warn"}
		sp.bind = map[int]string{p: "2379/tcp"}
	}
	return sp, addr, dsn
}

// startServer starts one server of kind in a new container and waits until it answers.
func startServer(kind string) (*Server, error) { return startServerWith(kind, nil) }

// startServerWith is startServer with the container's spec, and the server
// (its DSN), changed by mod (nil: as is).
func startServerWith(kind string, mod func(e *engine, sp *spec, ports []int, s *Server) error) (*Server, error) {
	e, err := getEngine()
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 3 { // a new try only when the server died at once: maybe a port race
		ports, err := freePorts(2)
		if err != nil {
			return nil, err
		}
		sp, addr, dsn := e.serverSpec(kind, ports)
		srv := &Server{kind: kind, addr: addr, dsn: dsn}
		if mod != nil {
			if err := mod(e, &sp, ports, srv); err != nil {
				return nil, err
			}
		}
		s, err := runServers(e, kind, sp, []*Server{srv}, nil)
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

// zooCfgExtra makes a ZooKeeper container add lines to its zoo.cfg: the
// official image appends the space-separated entries of ZOO_CFG_EXTRA
// itself; for the local image, whose entry script writes zoo.cfg and starts
// the server at once, the script is run through a copy with the lines put
// in just before the end of its zoo.cfg (so build/docker, and the image
// every other test uses, stay as they are). The Go side checks the lines
// (key=value, no spaces); whether the server took them is for the test to
// check (see NewZooKeeperWith).
func zooCfgExtra(lines []string) func(e *engine, sp *spec, ports []int, s *Server) error {
	return func(e *engine, sp *spec, ports []int, _ *Server) error {
		if sp.env == nil {
			sp.env = map[string]string{}
		}
		sp.env["ZOO_CFG_EXTRA"] = strings.Join(lines, " ")
		if e.profile != profileLocal {
			return nil
		}
		const script = `set -eu
awk 'BEGIN { n = split(ENVIRON["ZOO_CFG_EXTRA"], extra, " ") }
/^CFG$/ && !done { for (i = 1; i <= n; i++) print extra[i]; done = 1 }
{ print }
END { if (!done) exit 3 }' /usr/local/bin/locker-serve >/tmp/locker-serve-zk
exec sh /tmp/locker-serve-zk zookeeper "$1"`
		sp.entrypoint = []string{"/bin/sh", "-c", script, "locker-serve-zk"}
		sp.cmd = []string{strconv.Itoa(ports[0])}
		return nil
	}
}

// runServers runs the container sp for the given servers, waits until each answers,
// runs setup if any, and fills in their container.
func runServers(e *engine, kind string, sp spec, servers []*Server, setup func(context.Context) error) ([]*Server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := e.runContainer(ctx, kind, sp)
	if err != nil {
		return nil, err
	}
	for _, s := range servers {
		s.ctr = c
		if len(servers) > 1 {
			s.members = servers
		}
	}
	fail := func(err error) ([]*Server, error) {
		logs := containerLogs(c)
		removeContainer(c)
		if logs != "" {
			err = fmt.Errorf("%w\n--- end of the container's output ---\n%s", err, logs)
		}
		return nil, err
	}
	for _, s := range servers {
		if err := waitAnswer(ctx, s); err != nil {
			return fail(fmt.Errorf("%s did not become ready: %w", s, err))
		}
	}
	if setup != nil {
		if err := setup(ctx); err != nil {
			return fail(err)
		}
		for _, s := range servers {
			if err := waitReady(ctx, s); err != nil {
				return fail(fmt.Errorf("%s did not become ready: %w", s, err))
			}
		}
	}
	return servers, nil
}

var errExited = errors.New("the container exited")

func isExited(err error) bool { return errors.Is(err, errExited) }

// waitReady waits until s answers a real ping: the server is up and serving.
func waitReady(ctx context.Context, s *Server) error { return wait(ctx, s, true) }

// waitAnswer waits until s answers a ping, before any setup (a Redis cluster node
// answers PING before its cluster is formed).
func waitAnswer(ctx context.Context, s *Server) error { return wait(ctx, s, false) }

func wait(ctx context.Context, s *Server, full bool) error {
	var last error
	for {
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		last = ping(pctx, s, full)
		cancel()
		if last == nil && s.ctr != nil {
			// Whoever answered, our container must still run: on host
			// networking a server that lost its port to another test's
			// exits, and the answer came from that other server.
			if st, err := s.ctr.State(ctx); err == nil && !st.Running && !st.Restarting {
				return fmt.Errorf("%w (code %d) though its port answered: another server has the port", errExited, st.ExitCode)
			}
		}
		if last == nil {
			return nil
		}
		if s.ctr != nil {
			st, err := s.ctr.State(ctx)
			if err == nil && !st.Running && !st.Restarting {
				return fmt.Errorf("%w (code %d): %v", errExited, st.ExitCode, last)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w; last ping: %v", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ping checks that s answers through its real protocol.
func ping(ctx context.Context, s *Server, full bool) error {
	switch s.kind {
	case kindRedis:
		c := redis.NewClient(&redis.Options{Addr: s.addr, DialTimeout: 2 * time.Second, MaxRetries: -1, PoolSize: 1, ContextTimeoutEnabled: true})
		defer c.Close()
		return c.Ping(ctx).Err()
	case kindRedisCluster:
		c := redis.NewClient(&redis.Options{Addr: s.addr, DialTimeout: 2 * time.Second, MaxRetries: -1, PoolSize: 1, ContextTimeoutEnabled: true})
		defer c.Close()
		if err := c.Ping(ctx).Err(); err != nil || !full {
			return err
		}
		info, err := c.ClusterInfo(ctx).Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:3") {
			return errors.New("cluster not formed yet")
		}
		// Every node has heard of the highest config epoch that formCluster
		// gave, so a slot moved later gets an epoch above all of them.
		if e := clusterInfoInt(info, "cluster_current_epoch"); e < clusterNodes {
			return fmt.Errorf("cluster epochs not settled yet (cluster_current_epoch %d)", e)
		}
		return nil
	case kindPostgres:
		conn, err := pgx.Connect(ctx, s.DSN())
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		var one int
		return conn.QueryRow(ctx, "SELECT 1").Scan(&one)
	case kindMySQL:
		cfg, err := mysql.ParseDSN(s.DSN())
		if err != nil {
			return err
		}
		cfg.Timeout = 2 * time.Second
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			return err
		}
		db := sql.OpenDB(conn)
		defer db.Close()
		var one int
		return db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
	case kindZooKeeper:
		return pingZooKeeper(ctx, s.addr)
	case kindEtcd:
		return pingEtcd(ctx, s.addr)
	case kindEtcdTLS:
		return pingEtcdTLS(ctx, s.addr)
	}
	return fmt.Errorf("unknown kind %q", s.kind)
}

func pingZooKeeper(ctx context.Context, addr string) error {
	// zk.Connect retries in the background until ctx ends; fail fast when nothing listens.
	d := net.Dialer{}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	_ = c.Close()
	conn, events, err := zk.Connect([]string{addr}, 4*time.Second, zk.WithLogger(quietLogger{}),
		zk.WithDialer(func(network, address string, timeout time.Duration) (net.Conn, error) {
			d := net.Dialer{Timeout: timeout}
			return d.DialContext(ctx, network, address)
		}))
	if err != nil {
		return err
	}
	defer conn.Close()
	for {
		select {
		case ev := <-events:
			if ev.State == zk.StateHasSession {
				_, _, err := conn.Exists("/")
				return err
			}
		case <-ctx.Done():
			return fmt.Errorf("no zookeeper session: %w", ctx.Err())
		}
	}
}

func pingEtcd(ctx context.Context, addr string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var h struct {
		Health string `json:"health"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return fmt.Errorf("etcd /health: %w", err)
	}
	if h.Health != "true" {
		return fmt.Errorf("etcd /health: %q", h.Health)
	}
	return nil
}

// hostPortFromDSN extracts host:port from a PostgreSQL URL or key=value DSN, or from a
// go-sql-driver MySQL DSN; it returns the DSN itself when it cannot.
func hostPortFromDSN(kind, dsn string) string {
	switch kind {
	case kindPostgres:
		if u, err := url.Parse(dsn); err == nil && u.Host != "" {
			if u.Port() == "" {
				return net.JoinHostPort(u.Hostname(), "5432")
			}
			return u.Host
		}
		host, port := "", "5432"
		for _, f := range strings.Fields(dsn) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "host":
				host = v
			case "port":
				port = v
			}
		}
		if host != "" {
			return net.JoinHostPort(host, port)
		}
	case kindMySQL:
		if cfg, err := mysql.ParseDSN(dsn); err == nil && cfg.Addr != "" {
			return cfg.Addr
		}
	}
	return dsn
}

// clusterInfoInt returns the integer field name of a CLUSTER INFO reply, or -1.
func clusterInfoInt(info, name string) int {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			if n, err := strconv.Atoi(v); err == nil {
				return n
			}
		}
	}
	return -1
}
