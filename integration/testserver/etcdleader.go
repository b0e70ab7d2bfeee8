package testserver

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// WaitEtcdLeader waits until every member of ms names the same leader and
// answers a linearizable read of its own (which needs the leader and the
// member's log caught up), as after a member was paused, stopped or killed
// and brought back: a resumed old leader may still believe it leads for a
// moment, and a member that rejoins serves nothing until it has caught up.
// A test that disturbs the shared cluster calls it before it returns, so
// the next test starts on a settled cluster.
func WaitEtcdLeader(t testing.TB, ms []*Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := waitEtcdLeader(ctx, ms); err != nil {
		t.Fatalf("testserver: %v", err)
	}
	for _, m := range ms {
		if err := waitEtcdServes(ctx, m); err != nil {
			t.Fatalf("testserver: %s: %v", m, err)
		}
	}
}

// waitEtcdServes waits until a client of m alone gets a linearizable read
// answered within a second.
func waitEtcdServes(ctx context.Context, m *Server) error {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + m.addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer c.Close()
	for {
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Get(rctx, "testserver/health")
		rcancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no linearizable read answered: %w (last: %v)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
