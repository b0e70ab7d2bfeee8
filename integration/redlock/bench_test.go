package redlock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/go-redsync/redsync/v4"
	rsredis "github.com/go-redsync/redsync/v4/redis"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/redis"
	"github.com/go-locker/locker/redis/redlock"
)

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// benchClients returns direct clients of addrs (no proxies), closed at the
// end of the benchmark.
func benchClients(b testing.TB, addrs []string) []*goredis.Client {
	out := make([]*goredis.Client, len(addrs))
	for i, a := range addrs {
		out[i] = newClient(b, a)
	}
	return out
}

func universal(cs []*goredis.Client) []goredis.UniversalClient {
	out := make([]goredis.UniversalClient, len(cs))
	for i, c := range cs {
		out[i] = c
	}
	return out
}

func newRedsync(cs []*goredis.Client) *redsync.Redsync {
	var pools []rsredis.Pool
	for _, c := range cs {
		pools = append(pools, rsgoredis.NewPool(c))
	}
	return redsync.New(pools...)
}

// BenchmarkLock runs the shared cases (conformance/benchmark) on this
// package's Locker on 3 nodes beside go-redsync/redsync v4 on the same 3
// nodes (SET NX PX on each, DEL by Lua; no tokens, no write-back round; it
// polls with its default random 50–250ms retry delay, with tries enough
// never to give up) and the single-node redis backend on node 1 (single):
// every contender on clients of its own, like processes.
//
//	cd integration && go test -run '^$' -bench '^BenchmarkLock$' -benchtime 400x ./redlock
func BenchmarkLock(b *testing.B) {
	addrs := nodeAddrs(b, 3)
	benchmark.Run(b, benchmark.Harness{Sides: []benchmark.Side{
		benchmark.LockerSide("redlock", 0, func(tb testing.TB) locker.Locker {
			return redlock.New(benchClients(tb, addrs))
		}),
		{Name: "redsync", New: func(tb testing.TB, key string, _ int) benchmark.Lock {
			rs := newRedsync(benchClients(tb, addrs))
			return func(ctx context.Context) (func(context.Context) error, error) {
				m := rs.NewMutex(key, redsync.WithTries(1<<20))
				if err := m.LockContext(ctx); err != nil {
					return nil, err
				}
				return func(ctx context.Context) error { _, err := m.UnlockContext(ctx); return err }, nil
			}
		}},
		benchmark.LockerSide("single", 0, func(tb testing.TB) locker.Locker { return redis.New(newClient(tb, addrs[0])) }),
	}})
}
