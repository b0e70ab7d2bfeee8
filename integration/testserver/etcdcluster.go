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

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdClusterSize is the number of members EtcdCluster starts.
const EtcdClusterSize = 3

// EnvEtcdCluster names an existing etcd cluster (comma-separated host:port
// client addresses of its members) for EtcdCluster to use instead of
// starting one; its members' CanControl is false.
const EnvEtcdCluster = "LOCKER_TEST_ETCD_CLUSTER"

// EtcdCluster returns a 3-member etcd cluster shared by the tests of this
// binary (and handed to the child processes they start), each member in a
// container of its own on its own loopback client and peer ports, so that
// a test can stop, pause or kill members one by one (Stop, Pause, Kill of a
// member act on its container only; a test that does so must leave the
// member running). Addr of each member is its client address; the cluster
// has a leader when EtcdCluster first returns.
//
// The members reach each other over the host's loopback, so the cluster
// needs host networking: it is available with LOCKER_TEST_IMAGES=local
// (images built by scripts/docker-up.sh), and skips otherwise.
func EtcdCluster(t testing.TB) []*Server {
	t.Helper()
	if v := fromEnv(EnvEtcdCluster); v != "" {
		return envServers(kindEtcd, EnvEtcdCluster, v)
	}
	if v := inherited(EnvEtcdCluster); v != "" {
		return envServers(kindEtcd, inheritVar(EnvEtcdCluster), v)
	}
	e, err := getEngine()
	if err != nil {
		unavailable(t, "etcd cluster", EnvEtcdCluster, err)
	}
	if e.profile != profileLocal {
		t.Skipf("testserver: a %d-member etcd cluster needs host networking: set %s=local, or %s", EtcdClusterSize, EnvImages, EnvEtcdCluster)
	}
	ms, err := getShared("etcd-cluster", func() ([]*Server, error) {
		ms, err := startEtcdCluster(e)
		if err == nil {
			addrs := make([]string, len(ms))
			for i, s := range ms {
				addrs[i] = s.Addr()
			}
			publish(EnvEtcdCluster, strings.Join(addrs, ","))
		}
		return ms, err
	})
	if err != nil {
		unavailable(t, "etcd cluster", EnvEtcdCluster, err)
	}
	return ms
}

func startEtcdCluster(e *engine) ([]*Server, error) {
	ports, err := freePorts(2 * EtcdClusterSize)
	if err != nil {
		return nil, err
	}
	client, peer := ports[:EtcdClusterSize], ports[EtcdClusterSize:]
	token := fmt.Sprintf("locker-%d", time.Now().UnixNano())
	var initial []string
	for i := range EtcdClusterSize {
		initial = append(initial, fmt.Sprintf("m%d=http://127.0.0.1:%d", i, peer[i]))
	}
	out := make([]*Server, EtcdClusterSize)
	errs := make([]error, EtcdClusterSize)
	var wg sync.WaitGroup
	for i := range EtcdClusterSize {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := strconv.Itoa(client[i])
			p := strconv.Itoa(peer[i])
			sp := spec{image: e.image, entrypoint: []string{"etcd"}, cmd: []string{
				"--name", fmt.Sprintf("m%d", i), "--data-dir", "/srv/etcd",
				"--listen-client-urls", "http://127.0.0.1:" + c, "--advertise-client-urls", "http://127.0.0.1:" + c,
				"--listen-peer-urls", "http://127.0.0.1:" + p, "--initial-advertise-peer-urls", "http://127.0.0.1:" + p,
				"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-token", token,
				"--initial-cluster-state", "new", "--log-level", "warn",
			}}
			ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
			defer cancel()
			ctr, err := e.runContainer(ctx, kindEtcd, sp)
			if err != nil {
				errs[i] = err
				return
			}
			out[i] = &Server{kind: kindEtcd, addr: net.JoinHostPort("127.0.0.1", c), ctr: ctr}
		}()
	}
	wg.Wait()
	fail := func(err error) ([]*Server, error) {
		for _, s := range out {
			if s != nil {
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
	if err := waitEtcdLeader(ctx, out); err != nil {
		return fail(err)
	}
	return out, nil
}

// waitEtcdLeader waits until every member knows the same leader.
func waitEtcdLeader(ctx context.Context, ms []*Server) error {
	eps := make([]string, len(ms))
	for i, s := range ms {
		eps[i] = "http://" + s.addr
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer c.Close()
	var last error
	for {
		leaders := map[uint64]bool{}
		last = nil
		for _, ep := range eps {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			st, err := c.Status(sctx, ep)
			cancel()
			if err != nil {
				last = err
				break
			}
			leaders[st.Leader] = true
		}
		if last == nil && len(leaders) == 1 && !leaders[0] {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcd cluster formed no leader: %w (last: %v)", ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// EtcdLeader returns the member of ms that is the cluster's leader now.
func EtcdLeader(t testing.TB, ms []*Server) *Server {
	t.Helper()
	eps := make([]string, len(ms))
	for i, s := range ms {
		eps[i] = "http://" + s.addr
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("EtcdLeader: %v", err)
	}
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, s := range ms {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			st, err := c.Status(ctx, "http://"+s.addr)
			cancel()
			if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
				return s
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("EtcdLeader: no member says it leads")
	return nil
}
