package redis_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis"
)

// TestReplicaAckWithoutReplica: a server without replicas confirms
// nothing, so with WithReplicaAck every acquisition (TryAcquire, Acquire,
// a semaphore's) is given back and fails with ErrNotReplicated; the key is
// free afterwards, and the fence counter kept every increment (tokens only
// grow).
func TestReplicaAckWithoutReplica(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	defer c.Close()
	l := redis.New(c, redis.WithReplicaAck(1, 100*time.Millisecond))
	defer l.Close()
	key := t.Name()
	start := time.Now()
	_, err := l.TryAcquire(ctx, key)
	if !errors.Is(err, redis.ErrNotReplicated) || errors.Is(err, locker.ErrNotAcquired) || !strings.Contains(err.Error(), "0 of the 1 replicas") {
		t.Fatalf("TryAcquire = %v, want ErrNotReplicated (0 of the 1 replicas), not ErrNotAcquired", err)
	}
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Errorf("TryAcquire failed after %v, before WAIT's timeout of 100ms", took)
	}
	if _, err := l.Acquire(ctx, key); !errors.Is(err, redis.ErrNotReplicated) {
		t.Fatalf("Acquire = %v, want ErrNotReplicated", err)
	}
	if _, err := locker.Semaphore(l, 2).TryAcquire(ctx, key); !errors.Is(err, redis.ErrNotReplicated) {
		t.Fatalf("semaphore TryAcquire = %v, want ErrNotReplicated", err)
	}
	plain := redis.New(c)
	defer plain.Close()
	h, err := plain.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("the refused acquisitions left the key taken: %v", err)
	}
	defer h.Release(ctx)
	if h.Token() != 3 {
		t.Errorf("token after two refused acquisitions = %d, want 3 (their increments kept)", h.Token())
	}
}

// TestReplicaAckSentinel: with a replica that confirms, acquisitions and
// renewals go through; while the replica is paused, renewals are not
// confirmed and the lock is at risk (not lost: the lease has time left),
// and it clears once the replica is back.
func TestReplicaAckSentinel(t *testing.T) {
	g := testserver.RedisSentinel(t)
	ctx := testCtx(t)
	c := goredis.NewFailoverClient(&goredis.FailoverOptions{
		MasterName: testserver.SentinelMasterName, SentinelAddrs: g.SentinelAddrs(), ContextTimeoutEnabled: true,
	})
	defer c.Close()
	l := redis.New(c, redis.WithReplicaAck(1, 200*time.Millisecond), redis.WithDefaultTTL(6*time.Second))
	defer l.Close()
	h, err := l.TryAcquire(ctx, t.Name())
	if err != nil {
		t.Fatalf("TryAcquire with a replica: %v", err)
	}
	r := h.(locker.AtRisker)
	if risk, _ := r.AtRisk(); risk {
		t.Fatal("at risk right after the acquisition")
	}
	replica := g.Other(g.Master(t))
	replica.Pause(t)
	paused := true
	defer func() {
		if paused {
			replica.Resume(t)
		}
	}()
	waitRisk := func(want bool) {
		t.Helper()
		for {
			risk, changed := r.AtRisk()
			if risk == want {
				return
			}
			select {
			case <-changed:
			case <-h.Done():
				t.Fatalf("lock ended while waiting for at risk = %v: %v", want, h.Err())
			case <-ctx.Done():
				t.Fatalf("at risk never became %v", want)
			}
		}
	}
	waitRisk(true)
	replica.Resume(t)
	paused = false
	waitRisk(false)
	if err := h.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
}
