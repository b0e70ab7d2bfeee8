package testserver

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresPair is a PostgreSQL primary and a streaming standby of it,
// each in a container of its own on its own loopback port, private to the
// test that made it. Primary commits as a deployment does (a commit waits
// for its WAL, which the standby streams at once; fsync stays off: the
// containers are not what is tested); with Sync the primary also waits for
// the standby to have each commit (synchronous_standby_names='*'). Kill
// the primary (Server.Kill) and Promote the standby for a failover.
type PostgresPair struct {
	Primary, Standby *Server
	Sync             bool
}

// PostgresStandby starts a PostgresPair for the test; it is removed at
// t.Cleanup. The standby reaches the primary over the host's loopback, so
// it needs host networking: LOCKER_TEST_IMAGES=local (the image of
// scripts/docker-up.sh); it skips otherwise, or fails with
// LOCKER_REQUIRE_SERVERS=1.
func PostgresStandby(t testing.TB, sync bool) *PostgresPair {
	t.Helper()
	e, fail := pairEngine(t, "a PostgreSQL primary and standby")
	p := &PostgresPair{Sync: sync}
	t.Cleanup(func() {
		for _, s := range []*Server{p.Standby, p.Primary} {
			if s != nil {
				terminate(s)
			}
		}
	})
	mode := "primary"
	if sync {
		mode = "primary-sync"
	}
	mk := func(port int, cmd ...string) (*Server, error) {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		ctr, err := e.runContainer(ctx, kindPostgres, spec{image: e.image, cmd: cmd})
		if err != nil {
			return nil, err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		s := &Server{kind: kindPostgres, addr: addr, ctr: ctr,
			dsn: fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", dbUser, dbPassword, addr, dbName)}
		if err := waitReady(ctx, s); err != nil {
			terminate(s)
			return nil, fmt.Errorf("%s did not become ready: %w: %s", s, err, containerLogs(ctr))
		}
		return s, nil
	}
	err := startPair(func(ports []int) (first, second *Server, err error) {
		if first, err = mk(ports[0], kindPostgres, strconv.Itoa(ports[0]), mode); err != nil {
			return nil, nil, err
		}
		second, err = mk(ports[1], "postgres-standby", strconv.Itoa(ports[1]), strconv.Itoa(ports[0]))
		return first, second, err
	}, &p.Primary, &p.Standby)
	if err != nil {
		fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.waitStreaming(ctx); err != nil {
		t.Fatalf("testserver: %s does not stream from %s: %v", p.Standby, p.Primary, err)
	}
	return p
}

// waitStreaming waits until the primary reports its standby streaming
// (and, with Sync, as its synchronous standby).
func (p *PostgresPair) waitStreaming(ctx context.Context) error {
	want := "async"
	if p.Sync {
		want = "sync"
	}
	var last error
	for {
		conn, err := pgx.Connect(ctx, p.Primary.DSN())
		if err == nil {
			var state, syncState string
			err = conn.QueryRow(ctx, "SELECT state, sync_state FROM pg_stat_replication LIMIT 1").Scan(&state, &syncState)
			conn.Close(context.Background())
			if err == nil && state == "streaming" && syncState == want {
				return nil
			}
			if err == nil {
				err = fmt.Errorf("replication state %q, %q", state, syncState)
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Promote promotes the standby (SELECT pg_promote(), which waits until it
// accepts writes) and returns it: the new primary.
func (p *PostgresPair) Promote(t testing.TB) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.Standby.DSN())
	if err != nil {
		t.Fatalf("testserver: promote %s: %v", p.Standby, err)
	}
	defer conn.Close(context.Background())
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&ok); err != nil || !ok {
		t.Fatalf("testserver: promote %s: %v (promoted: %v)", p.Standby, err, ok)
	}
	return p.Standby
}

// ReplayLag returns how far the standby's replay is behind the primary's
// WAL (bytes), as the primary reports it.
func (p *PostgresPair) ReplayLag(ctx context.Context) (int64, error) {
	conn, err := pgx.Connect(ctx, p.Primary.DSN())
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var lag int64
	err = conn.QueryRow(ctx, "SELECT COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn), 0)::bigint FROM pg_stat_replication LIMIT 1").Scan(&lag)
	return lag, err
}

// DSN is a DSN that names both servers, primary first, and asks for the
// one that takes writes (target_session_attrs=read-write), with a 2s
// connect timeout: what a deployment with a standby gives its clients, so
// that after a promotion their new connections go to the new primary.
func (p *PostgresPair) DSN(t testing.TB) string {
	t.Helper()
	u, err := url.Parse(p.Primary.DSN())
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.Primary.Addr() + "," + p.Standby.Addr()
	q := u.Query()
	q.Set("target_session_attrs", "read-write")
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	return u.String()
}

// WaitReplayed waits until the standby has replayed all the primary
// wrote (ReplayLag 0), or fails t when ctx ends first.
func (p *PostgresPair) WaitReplayed(t testing.TB, ctx context.Context) {
	t.Helper()
	for {
		lag, err := p.ReplayLag(ctx)
		if err == nil && lag == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("testserver: %s did not catch up with %s: lag %d bytes, %v", p.Standby, p.Primary, lag, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// startPair starts two servers with start on two free ports, and stores
// them in first and second. A server that exits at once (errExited) may
// have lost its port to another test's server between freePorts and its
// start (three packages start servers at once in make test): then both are
// removed and started again on new ports, three times at most, as
// startServerWith does for one server.
func startPair(start func(ports []int) (first, second *Server, err error), first, second **Server) error {
	var err error
	for range 3 {
		var ports []int
		if ports, err = freePorts(2); err != nil {
			return err
		}
		var a, b *Server
		a, b, err = start(ports)
		if err == nil {
			*first, *second = a, b
			return nil
		}
		for _, s := range []*Server{b, a} {
			if s != nil {
				terminate(s)
			}
		}
		if !isExited(err) {
			return err
		}
	}
	return err
}

// pairEngine is the engine for a bed of two servers that reach each other
// over the host's loopback (what names them in msgs), which needs host
// networking: LOCKER_TEST_IMAGES=local. It skips t otherwise; fail skips
// t, or fails it with LOCKER_REQUIRE_SERVERS=1, for a bed that could not
// start.
func pairEngine(t testing.TB, what string) (*engine, func(error)) {
	t.Helper()
	fail := func(err error) {
		t.Helper()
		msg := "testserver: no " + what + " (they need a Docker engine and " + EnvImages + "=local): " + err.Error()
		if required() {
			t.Fatal(msg + " [" + EnvRequire + " is set, so this fails instead of skipping]")
		}
		t.Skip(msg)
	}
	e, err := getEngine()
	if err != nil {
		fail(err)
	}
	if e.profile != profileLocal {
		t.Skipf("testserver: %s needs host networking: set %s=local", what, EnvImages)
	}
	return e, fail
}
