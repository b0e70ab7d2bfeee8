package etcd_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/go-locker/locker/etcd"
	"github.com/go-locker/locker/integration/testserver"
)

// contendedClients is the number of clients of BenchmarkContended.
const contendedClients = 8

// lockFuncs are one contender's lock and unlock.
type lockFuncs struct{ lock, unlock func(context.Context) error }

// lockerContender is a contender on a Locker and an etcd client of its own
// (like another process).
// Its client's requests are counted in rc, if not nil.
func lockerContender(b *testing.B, addr, key string, rc *rpcCounter) lockFuncs {
	cli := newEtcdClient(b, addr)
	if rc != nil {
		rc.count(cli)
	}
	l := etcd.New(cli)
	b.Cleanup(func() { _ = l.Close() })
	var h interface{ Release(context.Context) error }
	return lockFuncs{
		lock: func(ctx context.Context) error {
			hh, err := l.Acquire(ctx, key)
			if err == nil {
				h = hh
			}
			return err
		},
		unlock: func(ctx context.Context) error { return h.Release(ctx) },
	}
}

// mutexContender is a contender on a concurrency.Mutex of a session of its
// own on an etcd client of its own.
// Its client's requests are counted in rc, if not nil.
func mutexContender(b *testing.B, addr, key string, rc *rpcCounter) lockFuncs {
	cli := newEtcdClient(b, addr)
	if rc != nil {
		rc.count(cli)
	}
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	m := concurrency.NewMutex(s, "/"+key)
	return lockFuncs{lock: m.Lock, unlock: m.Unlock}
}

// BenchmarkContended runs 8 clients (each a Locker, or a
// concurrency.Session and Mutex, on an etcd client of its own) that take
// and release one key in a loop, for the locker and concurrency.Mutex
// interleaved in phases of contendedPhase acquisitions (see
// BenchmarkHandoff), b.N counted acquisitions per side. Each side reports
// acquisitions per second (over the phases' counted spans) and fairness:
// the fewest acquisitions of one client over the most (1 is perfectly
// even). ns/op is the wall time of the whole run per acquisition of one
// side.
func BenchmarkContended(b *testing.B) {
	srv := testserver.Etcd(b)
	b.Run(fmt.Sprintf("clients=%d", contendedClients), func(b *testing.B) {
		id := time.Now().UnixNano()
		lk, mk := fmt.Sprintf("bench/contended/%d", id), fmt.Sprintf("bench/contended-mutex/%d", id)
		sides := []*handoffSide{
			newHandoffSide(b, "locker", contendedClients-1, func(rc *rpcCounter) lockFuncs { return lockerContender(b, srv.Addr(), lk, rc) }),
			newHandoffSide(b, "mutex", contendedClients-1, func(rc *rpcCounter) lockFuncs { return mutexContender(b, srv.Addr(), mk, rc) }),
		}
		runPhases(b, contendedPhase, sides)
		for _, s := range sides {
			if s.busy > 0 {
				b.ReportMetric(float64(s.spans)/s.busy.Seconds(), s.name+"-acq/s")
			}
			if b.N >= contendedClients {
				b.ReportMetric(float64(slices.Min(s.counts))/float64(slices.Max(s.counts)), s.name+"-min/max")
			}
			s.reportRPCs(b)
		}
	})
}

// contendedPhase is how many acquisitions one side counts before the other
// takes its turn in BenchmarkContended: long enough that the turn's edges
// (where the round-robin order restarts) barely move the shares.
const contendedPhase = 400
