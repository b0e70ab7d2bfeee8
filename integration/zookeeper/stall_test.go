package zookeeper_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/zookeeper"
)

// TestEnsembleStalledFollowerHolderLosesFirst: a holder whose session is on
// a follower that stalls (a pause: a long GC, a frozen VM) reports its lock
// lost before a waiter on another server can get the key. The session is
// the leader's to expire, and the leader hears of the session's requests
// only when the follower passes them on, at its next ping from the leader
// (every half tick): the follower's last answer to the holder does not
// mean the leader heard of it. Today's failure (seen in TestChaosEnsemble,
// seed 9889725712351781899): the holder counted its session alive until
// one timeout after its last request the follower answered, the leader
// counted it from the request before (the follower froze before passing
// the last one on), expired it earlier, and the waiter took the key while
// the holder still held it.
//
// Each round lines the holder's last request up for that: go-zookeeper
// pings every third of the session timeout from the moment the session is
// made, so a request sent just before a ping is due is the furthest from
// the one before; the follower is paused right after it is answered.
func TestEnsembleStalledFollowerHolderLosesFirst(t *testing.T) {
	ms := testserver.ZooKeeperEnsemble(t)
	for _, m := range ms {
		if !m.CanControl() {
			t.Skip("the ensemble comes from the environment: this test pauses a follower")
		}
	}
	const ttl = 6 * time.Second // pings every 2s
	for round := range 3 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			leader := testserver.ZooKeeperLeader(t, ms)
			follower := others(ms, leader)[round%2]
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			holder, err := zookeeper.Connect(ctx, []string{follower.Addr()}, zookeeper.WithDefaultTTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			born := time.Now() // go-zookeeper's ping ticker started just before
			defer holder.Close()
			waiter, err := zookeeper.Connect(ctx, []string{leader.Addr()}, zookeeper.WithDefaultTTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			defer waiter.Close()
			key := testKey(t)
			h, err := holder.Acquire(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			lost := make(chan time.Time, 1)
			go func() { <-h.Done(); lost <- time.Now() }()
			type got struct {
				h  locker.Handle
				at time.Time
			}
			won := make(chan got, 1)
			go func() {
				wh, err := waiter.Acquire(ctx, key)
				if err != nil {
					t.Errorf("waiter: %v", err)
					close(won)
					return
				}
				won <- got{wh, time.Now()}
			}()
			// The last request: 1.7s into a ping interval, at least one
			// interval after the acquire.
			ping := ttl / 3
			next := born.Add(ping*(time.Since(born)/ping+1) + ping*85/100)
			time.Sleep(time.Until(next))
			if _, err := holder.Inspect(ctx, key); err != nil {
				t.Fatalf("Inspect before the pause: %v", err)
			}
			follower.Pause(t)
			paused := time.Now()
			resumed := false
			resume := func() {
				if !resumed {
					resumed = true
					follower.Resume(t)
				}
			}
			defer resume()
			var lostAt, wonAt time.Time
			var wh locker.Handle
			for lostAt.IsZero() || wonAt.IsZero() {
				select {
				case lostAt = <-lost:
				case g, ok := <-won:
					if !ok {
						return
					}
					wh, wonAt = g.h, g.at
				case <-ctx.Done():
					t.Fatalf("after the pause (%v ago): holder lost at %v, waiter won at %v", time.Since(paused), lostAt, wonAt)
				}
			}
			resume()
			if wonAt.Before(lostAt) {
				t.Errorf("the waiter got the key %v after the pause, %v before the holder was told its lock was lost (%v after the pause): two holders",
					wonAt.Sub(paused).Round(time.Millisecond), lostAt.Sub(wonAt).Round(time.Millisecond), lostAt.Sub(paused).Round(time.Millisecond))
			} else {
				t.Logf("holder told %v after the pause, waiter got the key %v after", lostAt.Sub(paused).Round(time.Millisecond), wonAt.Sub(paused).Round(time.Millisecond))
			}
			if wh.Token() <= h.Token() {
				t.Errorf("waiter's token %d not above the holder's %d", wh.Token(), h.Token())
			}
			_ = wh.Release(ctx)
		})
	}
}

// TestServerRoleLearned: the Locker learns from each server it connects
// to whether that server expires sessions itself (standalone, leader),
// where an answer moves the lease at once, or passes them on (follower),
// where only its syncs do. A server whose role went unlearned would cost
// every standalone deployment the follower's shorter lease.
func TestServerRoleLearned(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	connect := func(t *testing.T, addr string) *testserver.LogRecorder {
		rec := &testserver.LogRecorder{}
		l, err := zookeeper.Connect(ctx, []string{addr}, zookeeper.WithLogger(rec.Logger()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return rec
	}
	t.Run("Standalone", func(t *testing.T) {
		connect(t, testserver.ZooKeeper(t).Addr()).WaitFor(t, 10*time.Second, "zookeeper server role", `mode="standalone"`)
	})
	t.Run("Ensemble", func(t *testing.T) {
		ms := testserver.ZooKeeperEnsemble(t)
		leader := testserver.ZooKeeperLeader(t, ms)
		connect(t, leader.Addr()).WaitFor(t, 10*time.Second, "zookeeper server role", `mode="leader"`)
		connect(t, others(ms, leader)[0].Addr()).WaitFor(t, 10*time.Second, "zookeeper server role", `mode="follower"`)
	})
}
