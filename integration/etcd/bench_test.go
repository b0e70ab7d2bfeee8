package etcd_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/go-locker/locker/etcd"
	"github.com/go-locker/locker/integration/testserver"
)

// Uncontended Acquire+Release, against concurrency.Mutex Lock+Unlock on a
// session, and against the floor: one Txn that puts a key and one Delete.
func BenchmarkUncontended(b *testing.B) {
	srv := testserver.Etcd(b)
	ctx := context.Background()
	b.Run("locker", func(b *testing.B) {
		cli := newEtcdClient(b, srv.Addr())
		l := etcd.New(cli)
		defer l.Close()
		k := fmt.Sprintf("bench/uncontended/%d", time.Now().UnixNano())
		b.ResetTimer()
		for b.Loop() {
			h, err := l.Acquire(ctx, k)
			if err != nil {
				b.Fatal(err)
			}
			if err := h.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("concurrency.Mutex", func(b *testing.B) {
		cli := newEtcdClient(b, srv.Addr())
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		m := concurrency.NewMutex(s, fmt.Sprintf("/bench/mutex/%d", time.Now().UnixNano()))
		b.ResetTimer()
		for b.Loop() {
			if err := m.Lock(ctx); err != nil {
				b.Fatal(err)
			}
			if err := m.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("floor-Txn+Delete", func(b *testing.B) {
		cli := newEtcdClient(b, srv.Addr())
		k := fmt.Sprintf("/bench/floor/%d", time.Now().UnixNano())
		b.ResetTimer()
		for b.Loop() {
			if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).Then(clientv3.OpPut(k, "")).Commit(); err != nil {
				b.Fatal(err)
			}
			if _, err := cli.Delete(ctx, k); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// Handoff latency (release to the next waiter holding) with n waiters,
// each on its own client, reported as p50 and p99.
func BenchmarkHandoff(b *testing.B) {
	srv := testserver.Etcd(b)
	for _, n := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("locker/waiters=%d", n), func(b *testing.B) {
			benchHandoff(b, n, func(b *testing.B) (func(context.Context) error, func(context.Context) error) {
				l := etcd.New(newEtcdClient(b, srv.Addr()))
				b.Cleanup(func() { _ = l.Close() })
				k := "bench/handoff/" + b.Name()
				var h interface{ Release(context.Context) error }
				return func(ctx context.Context) error {
						hh, err := l.Acquire(ctx, k)
						h = hh
						return err
					}, func(ctx context.Context) error {
						return h.Release(ctx)
					}
			})
		})
		b.Run(fmt.Sprintf("concurrency.Mutex/waiters=%d", n), func(b *testing.B) {
			benchHandoff(b, n, func(b *testing.B) (func(context.Context) error, func(context.Context) error) {
				s, err := concurrency.NewSession(newEtcdClient(b, srv.Addr()), concurrency.WithTTL(10))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = s.Close() })
				m := concurrency.NewMutex(s, "/bench/handoff-mutex/"+b.Name())
				return m.Lock, m.Unlock
			})
		})
	}
}

// benchHandoff runs n+1 contenders that each take the lock b.N/(n+1)
// times in turn and measures release→acquire gaps.
func benchHandoff(b *testing.B, n int, mk func(b *testing.B) (lock, unlock func(context.Context) error)) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	type contender struct{ lock, unlock func(context.Context) error }
	cs := make([]contender, n+1)
	for i := range cs {
		l, u := mk(b)
		cs[i] = contender{l, u}
	}
	var (
		mu       sync.Mutex
		released time.Time
		gaps     []time.Duration
		wg       sync.WaitGroup
		rounds   = max(b.N, n+1)
		taken    int
	)
	b.ResetTimer()
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if err := c.lock(ctx); err != nil {
					if ctx.Err() == nil {
						b.Error(err)
					}
					return
				}
				mu.Lock()
				if !released.IsZero() {
					gaps = append(gaps, time.Since(released))
				}
				taken++
				done := taken >= rounds
				released = time.Now()
				mu.Unlock()
				if err := c.unlock(context.Background()); err != nil {
					b.Error(err)
					return
				}
				if done {
					cancel()
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	sort.Slice(gaps, func(i, j int) bool { return gaps[i] < gaps[j] })
	if len(gaps) > 0 {
		b.ReportMetric(float64(gaps[len(gaps)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(gaps[len(gaps)*99/100].Microseconds()), "p99-µs")
	}
}
