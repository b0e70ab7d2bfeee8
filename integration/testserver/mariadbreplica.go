package testserver

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// MariaDBPair is a MariaDB primary and a replica of it (row-based, GTID),
// each in a container of its own on its own loopback port, private to the
// test that made it. With SemiSync the primary's commits wait for the
// replica's acknowledgement (semi-synchronous replication, with a timeout
// of an hour: it never falls back to asynchronous within a test). Kill the
// primary (Server.Kill) and Promote the replica for a failover; MariaDB has
// no multi-host client, so clients reach the primary through a Proxy that
// the test retargets, as a virtual IP would be moved.
type MariaDBPair struct {
	Primary, Replica *Server
	SemiSync         bool
}

// MariaDBReplica starts a MariaDBPair for the test; it is removed at
// t.Cleanup. The replica reaches the primary over the host's loopback, so
// it needs host networking: LOCKER_TEST_IMAGES=local; it skips otherwise,
// or fails with LOCKER_REQUIRE_SERVERS=1.
func MariaDBReplica(t testing.TB, semiSync bool) *MariaDBPair {
	t.Helper()
	e, fail := pairEngine(t, "a MariaDB primary and replica")
	p := &MariaDBPair{SemiSync: semiSync}
	t.Cleanup(func() {
		for _, s := range []*Server{p.Replica, p.Primary} {
			if s != nil {
				terminate(s)
			}
		}
	})
	mk := func(port int, role string) (*Server, error) {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		ctr, err := e.runContainer(ctx, kindMySQL, spec{image: e.image, cmd: []string{kindMySQL, strconv.Itoa(port), role}})
		if err != nil {
			return nil, err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		s := &Server{kind: kindMySQL, addr: addr, ctr: ctr, dsn: fmt.Sprintf("%s:%s@tcp(%s)/%s", dbUser, dbPassword, addr, dbName)}
		if err := waitReady(ctx, s); err != nil {
			terminate(s)
			return nil, fmt.Errorf("%s did not become ready: %w: %s", s, err, containerLogs(ctr))
		}
		return s, nil
	}
	err := startPair(func(ports []int) (first, second *Server, err error) {
		if first, err = mk(ports[0], "primary"); err != nil {
			return nil, nil, err
		}
		second, err = mk(ports[1], "replica")
		return first, second, err
	}, &p.Primary, &p.Replica)
	if err != nil {
		fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.setup(ctx); err != nil {
		t.Fatalf("testserver: replication from %s to %s: %v", p.Primary, p.Replica, err)
	}
	p.WaitReplicated(t, ctx)
	return p
}

func mariaDB(dsn string) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 2 * time.Second
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(1)
	return db, nil
}

// setup makes the replica replicate the primary from the start of its
// binary log (both servers ran the same initialisation, which the replica
// applies again: it is idempotent), and, with SemiSync, semi-synchronously.
func (p *MariaDBPair) setup(ctx context.Context) error {
	prim, err := mariaDB(p.Primary.DSN())
	if err != nil {
		return err
	}
	defer prim.Close()
	repl, err := mariaDB(p.Replica.DSN())
	if err != nil {
		return err
	}
	defer repl.Close()
	var stmts []struct {
		db *sql.DB
		q  string
	}
	add := func(db *sql.DB, q string) {
		stmts = append(stmts, struct {
			db *sql.DB
			q  string
		}{db, q})
	}
	if p.SemiSync {
		add(prim, "SET GLOBAL rpl_semi_sync_master_enabled = ON")
		add(prim, "SET GLOBAL rpl_semi_sync_master_timeout = 3600000")
		add(repl, "SET GLOBAL rpl_semi_sync_slave_enabled = ON")
	}
	_, port, _ := net.SplitHostPort(p.Primary.Addr())
	add(repl, fmt.Sprintf("CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = %s, MASTER_USER = '%s', MASTER_PASSWORD = '%s', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1",
		port, dbUser, dbPassword))
	add(repl, "START SLAVE")
	for _, st := range stmts {
		if _, err := st.db.ExecContext(ctx, st.q); err != nil {
			return fmt.Errorf("%s: %w", st.q, err)
		}
	}
	if p.SemiSync {
		for {
			var name, status string
			err := prim.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_master_clients'").Scan(&name, &status)
			if err == nil && status != "0" {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("the replica did not connect semi-synchronously: %v (%w)", err, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// WaitReplicated waits until the replica has applied every transaction the
// primary has logged, or fails t when ctx ends first.
func (p *MariaDBPair) WaitReplicated(t testing.TB, ctx context.Context) {
	t.Helper()
	prim, err := mariaDB(p.Primary.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer prim.Close()
	repl, err := mariaDB(p.Replica.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer repl.Close()
	var pos string
	if err := prim.QueryRowContext(ctx, "SELECT @@gtid_binlog_pos").Scan(&pos); err != nil {
		t.Fatalf("testserver: %s: gtid_binlog_pos: %v", p.Primary, err)
	}
	secs := 30
	if d, ok := ctx.Deadline(); ok {
		secs = max(1, int(time.Until(d).Seconds()))
	}
	var r int
	if err := repl.QueryRowContext(ctx, "SELECT MASTER_GTID_WAIT(?, ?)", pos, secs).Scan(&r); err != nil || r != 0 {
		t.Fatalf("testserver: %s did not apply %s's transactions up to %s: %v (MASTER_GTID_WAIT %d)", p.Replica, p.Primary, pos, err, r)
	}
}

// Promote makes the replica a primary: it stops replicating, forgets its
// primary and takes writes. It returns the replica.
func (p *MariaDBPair) Promote(t testing.TB) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	repl, err := mariaDB(p.Replica.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer repl.Close()
	for _, q := range []string{"STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = OFF"} {
		if _, err := repl.ExecContext(ctx, q); err != nil {
			t.Fatalf("testserver: promote %s: %s: %v", p.Replica, q, err)
		}
	}
	return p.Replica
}
