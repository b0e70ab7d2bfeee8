package testserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// ZooKeeperEnsembleSize is the number of servers ZooKeeperEnsemble starts.
const ZooKeeperEnsembleSize = 3

// EnvZooKeeperEnsemble names an existing ZooKeeper ensemble (comma-separated
// host:port client addresses of its servers) for ZooKeeperEnsemble to use
// instead of starting one; its servers' CanControl is false.
const EnvZooKeeperEnsemble = "LOCKER_TEST_ZOOKEEPER_ENSEMBLE"

// ZooKeeperEnsemble returns a 3-server ZooKeeper ensemble shared by the
// tests of this binary (and handed to the child processes they start), each
// server in a container of its own on its own loopback client, quorum and
// election ports, so that a test can stop, pause or kill servers one by one
// (a test that does so must leave the server running). Addr of each server
// is its client address; the ensemble has a leader and serves sessions on
// every server when ZooKeeperEnsemble first returns.
//
// The servers reach each other over the host's loopback, so the ensemble
// needs host networking: it is available with LOCKER_TEST_IMAGES=local
// (images built by scripts/docker-up.sh), and skips otherwise.
func ZooKeeperEnsemble(t testing.TB) []*Server {
	t.Helper()
	if v := fromEnv(EnvZooKeeperEnsemble); v != "" {
		return envServers(kindZooKeeper, EnvZooKeeperEnsemble, v)
	}
	if v := inherited(EnvZooKeeperEnsemble); v != "" {
		return envServers(kindZooKeeper, inheritVar(EnvZooKeeperEnsemble), v)
	}
	e, err := getEngine()
	if err != nil {
		unavailable(t, "zookeeper ensemble", EnvZooKeeperEnsemble, err)
	}
	if e.profile != profileLocal {
		t.Skipf("testserver: a %d-server ZooKeeper ensemble needs host networking: set %s=local, or %s", ZooKeeperEnsembleSize, EnvImages, EnvZooKeeperEnsemble)
	}
	ms, err := getShared("zookeeper-ensemble", func() ([]*Server, error) {
		ms, err := startZooKeeperEnsemble(e)
		if err == nil {
			addrs := make([]string, len(ms))
			for i, s := range ms {
				addrs[i] = s.Addr()
			}
			publish(EnvZooKeeperEnsemble, strings.Join(addrs, ","))
		}
		return ms, err
	})
	if err != nil {
		unavailable(t, "zookeeper ensemble", EnvZooKeeperEnsemble, err)
	}
	return ms
}

// zkEnsembleScript starts one server of an ensemble from the local image:
// it writes the server's myid and runs the image's entry script through a
// copy whose zoo.cfg also lists the ensemble (the server.N lines in
// ZOO_CFG_EXTRA), as zooCfgExtra does for a single server.
const zkEnsembleScript = `set -eu
mkdir -p /srv/zk
echo "$ZOO_MY_ID" >/srv/zk/myid
awk 'BEGIN { n = split(ENVIRON["ZOO_CFG_EXTRA"], extra, " ") }
/^CFG$/ && !done { for (i = 1; i <= n; i++) print extra[i]; done = 1 }
{ print }
END { if (!done) exit 3 }' /usr/local/bin/locker-serve >/tmp/locker-serve-zk
exec sh /tmp/locker-serve-zk zookeeper "$1"`

func startZooKeeperEnsemble(e *engine) ([]*Server, error) {
	const n = ZooKeeperEnsembleSize
	ports, err := freePorts(3 * n)
	if err != nil {
		return nil, err
	}
	client, quorum, election := ports[:n], ports[n:2*n], ports[2*n:]
	// forceSync=no: the servers write their transaction log without an
	// fsync each, as the tests kill processes (the page cache keeps what
	// was written), never the machine; three servers fsyncing on one disk
	// made a quorum write take tens of milliseconds.
	lines := []string{"forceSync=no"}
	for i := range n {
		lines = append(lines, fmt.Sprintf("server.%d=127.0.0.1:%d:%d", i+1, quorum[i], election[i]))
	}
	out := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := strconv.Itoa(client[i])
			sp := spec{
				image:      e.image,
				entrypoint: []string{"/bin/sh", "-c", zkEnsembleScript, "locker-serve-zk"},
				cmd:        []string{c},
				env:        map[string]string{"ZOO_MY_ID": strconv.Itoa(i + 1), "ZOO_CFG_EXTRA": strings.Join(lines, " ")},
			}
			ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
			defer cancel()
			ctr, err := e.runContainer(ctx, kindZooKeeper, sp)
			if err != nil {
				errs[i] = err
				return
			}
			out[i] = &Server{kind: kindZooKeeper, addr: net.JoinHostPort("127.0.0.1", c), ctr: ctr}
		}()
	}
	wg.Wait()
	fail := func(err error) ([]*Server, error) {
		for _, s := range out {
			if s != nil {
				if logs := containerLogs(s.ctr); logs != "" {
					err = fmt.Errorf("%w\n--- %s's output ---\n%s", err, s, logs)
				}
				terminate(s)
			}
		}
		return nil, err
	}
	if err := errors.Join(errs...); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for _, s := range out {
		if err := waitReady(ctx, s); err != nil {
			return fail(fmt.Errorf("%s did not become ready: %w", s, err))
		}
	}
	if _, err := zkLeader(ctx, out); err != nil {
		return fail(err)
	}
	return out, nil
}

// ZooKeeperMode asks s for its role ("leader", "follower", "standalone"),
// through the four-letter command srvr.
func ZooKeeperMode(ctx context.Context, s *Server) (string, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", s.addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte("srvr")); err != nil {
		return "", err
	}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		if m, ok := strings.CutPrefix(sc.Text(), "Mode: "); ok {
			return strings.TrimSpace(m), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s: no Mode in its srvr answer (not serving: no quorum?)", s)
}

// zkLeader waits until exactly one server of ms says it leads and every
// other says it follows, and returns the leader.
func zkLeader(ctx context.Context, ms []*Server) (*Server, error) {
	var last error
	for {
		var leader *Server
		leaders, followers := 0, 0
		last = nil
		for _, s := range ms {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			m, err := ZooKeeperMode(sctx, s)
			cancel()
			if err != nil {
				last = err
				continue
			}
			switch m {
			case "leader":
				leaders++
				leader = s
			case "follower":
				followers++
			}
		}
		if leaders == 1 && followers == len(ms)-1 {
			return leader, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("zookeeper ensemble formed no quorum: %w (%d leaders, %d followers; last: %v)", ctx.Err(), leaders, followers, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ZooKeeperLeader waits (up to a minute) until the ensemble ms has one
// leader and every other server follows it, and returns the leader.
func ZooKeeperLeader(t testing.TB, ms []*Server) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := zkLeader(ctx, ms)
	if err != nil {
		t.Fatalf("ZooKeeperLeader: %v", err)
	}
	return s
}
