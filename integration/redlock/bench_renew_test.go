package redlock_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/redis/redlock"
)

// roundTrips counts what a client sends: one per single command, one per
// pipeline (however many commands it carries), the commands, and the
// scripts among them (EVALSHA and EVAL: the rounds' requests, not a fresh
// connection's handshake or a subscription).
type roundTrips struct{ trips, cmds, scripts atomic.Int64 }

func (r *roundTrips) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (r *roundTrips) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		r.trips.Add(1)
		r.count(cmd)
		return next(ctx, cmd)
	}
}

func (r *roundTrips) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		r.trips.Add(1)
		for _, cmd := range cmds {
			r.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (r *roundTrips) count(cmd goredis.Cmder) {
	r.cmds.Add(1)
	if name := cmd.Name(); name == "evalsha" || name == "eval" {
		r.scripts.Add(1)
	}
}

// commandCalls reads how many calls of each command a node has served
// (INFO commandstats, by the command's name there: "evalsha",
// "config|get").
func commandCalls(tb testing.TB, c *goredis.Client) map[string]int64 {
	tb.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	calls := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_")
		if !ok {
			continue
		}
		name, stats, _ := strings.Cut(rest, ":calls=")
		if i := strings.IndexByte(stats, ','); i >= 0 {
			stats = stats[:i]
		}
		n, _ := strconv.ParseInt(stats, 10, 64)
		calls[name] = n
	}
	return calls
}

// evalshaCalls reads how many EVALSHA calls a node has served.
func evalshaCalls(b *testing.B, c *goredis.Client) int64 { return commandCalls(b, c)["evalsha"] }

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkManyHeld: one Locker on 5 nodes holds many keys (TTL 2s, so a
// renewal per key every 667ms) for three TTLs. Reported: the requests per
// key over the three TTLs (renewals/key: 9 with a round of five requests per
// key per renewal, far fewer since renewals that come due together go out
// as one round of a script per node), the EVALSHA calls node 1 served per
// key, the client's round trips per request (a pipeline counts once), the
// process's CPU time per request and per second of holding (cpu-ms/s),
// and the locks lost meanwhile (must be 0). It says how many locks a
// process can keep: before the batches, 2000 keys cost 15,000 requests a
// second and most of a core under -race on this 2-core machine.
func BenchmarkManyHeld(b *testing.B) {
	for _, n := range []int{500, 2000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			addrs := nodeAddrs(b, 5)
			const ttl = 2 * time.Second
			var rt roundTrips
			var cs []goredis.UniversalClient
			for _, a := range addrs {
				c := newClient(b, a)
				c.AddHook(&rt)
				cs = append(cs, c)
			}
			admin := admins(b, addrs)
			for range b.N {
				l := redlock.New(cs, redlock.WithDefaultTTL(ttl))
				ctx := context.Background()
				base := "bench/manyheld/" + randomID() + "/"
				handles := make([]locker.Handle, n)
				var wg sync.WaitGroup
				next := make(chan int)
				for range 16 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := range next {
							h, err := l.TryAcquire(ctx, base+strconv.Itoa(i))
							if err != nil {
								b.Error(err)
								continue
							}
							handles[i] = h
						}
					}()
				}
				for i := range n {
					next <- i
				}
				close(next)
				wg.Wait()
				if b.Failed() {
					b.FailNow()
				}
				trips0, cmds0, cpu0 := rt.trips.Load(), rt.cmds.Load(), cpuTime()
				calls0 := evalshaCalls(b, admin[0])
				time.Sleep(3 * ttl) // the renewals run meanwhile: this is what is measured
				trips, cmds, cpu := rt.trips.Load()-trips0, rt.cmds.Load()-cmds0, cpuTime()-cpu0
				calls := evalshaCalls(b, admin[0]) - calls0
				lost := 0
				for _, h := range handles {
					select {
					case <-h.Done():
						lost++
					default:
					}
				}
				for _, h := range handles {
					_ = h.Release(ctx)
				}
				_ = l.Close()
				b.ReportMetric(float64(cmds)/float64(len(addrs)*n), "renewals/key")
				b.ReportMetric(float64(calls)/float64(n), "node1-evalsha/key")
				b.ReportMetric(float64(trips)/float64(max(cmds, 1)), "trips/request")
				b.ReportMetric(float64(cpu.Microseconds())/float64(max(cmds, 1)), "cpu-µs/request")
				b.ReportMetric(float64(cpu.Milliseconds())/(3*ttl).Seconds(), "cpu-ms/s")
				b.ReportMetric(float64(lost), "lost")
			}
		})
	}
}
