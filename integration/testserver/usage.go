package testserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/redis/go-redis/v9"
	"github.com/testcontainers/testcontainers-go"

	"github.com/go-locker/locker/conformance/benchmark"
)

// ErrNoUsage is returned by CPU for a server the tests did not start (one
// named by an environment variable): its process is not theirs to read.
var ErrNoUsage = errors.New("testserver: the CPU of a server named by an environment variable is not known")

// CPU is the CPU time the server's container has used since it started,
// user and system, of every process in it (PostgreSQL's backends, a Redis
// Cluster's nodes): its cgroup's count, read from the cgroup's file on the
// engine's host, else from the engine's stats. It is what the benchmarks
// charge the server per acquisition (see conformance/benchmark.Usage).
func (s *Server) CPU(ctx context.Context) (time.Duration, error) {
	s.mu.Lock()
	ctr := s.ctr
	s.mu.Unlock()
	if ctr == nil {
		return 0, ErrNoUsage
	}
	if cpu, ok := cgroupCPU(ctr.GetContainerID()); ok {
		return cpu, nil
	}
	return s.statsCPU(ctx, ctr)
}

// statsCPU is the container's CPU as the engine's stats API reports it: it
// answers once a sample is collected, about one a second.
func (s *Server) statsCPU(ctx context.Context, ctr *testcontainers.DockerContainer) (time.Duration, error) {
	e, err := getEngine()
	if err != nil {
		return 0, err
	}
	res, err := e.api.ContainerStats(ctx, ctr.GetContainerID(), client.ContainerStatsOptions{})
	if err != nil {
		return 0, fmt.Errorf("testserver: stats of %s: %w", s, err)
	}
	defer res.Body.Close()
	var st container.StatsResponse
	if err := json.NewDecoder(res.Body).Decode(&st); err != nil {
		return 0, fmt.Errorf("testserver: stats of %s: %w", s, err)
	}
	if st.CPUStats.CPUUsage.TotalUsage == 0 {
		return 0, fmt.Errorf("testserver: the engine reports no CPU use for %s", s)
	}
	return time.Duration(st.CPUStats.CPUUsage.TotalUsage), nil
}

// cgroupCPU reads a container's CPU time from its cgroup when the tests run
// on the engine's host (cgroup v1's cpuacct, or v2's cpu.stat under the
// systemd or the cgroupfs layout), in microseconds where the stats API
// takes about a second a read; false when there is no such file (an engine
// in a VM, as Docker Desktop's).
func cgroupCPU(id string) (time.Duration, bool) {
	if b, err := os.ReadFile("/sys/fs/cgroup/cpuacct/docker/" + id + "/cpuacct.usage"); err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			return time.Duration(n), true
		}
	}
	for _, p := range []string{"/sys/fs/cgroup/system.slice/docker-" + id + ".scope/cpu.stat", "/sys/fs/cgroup/docker/" + id + "/cpu.stat"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
					return time.Duration(n) * time.Microsecond, true
				}
			}
		}
	}
	return 0, false
}

// ScaleUsage is the Usage probe of conformance/benchmark.RunScale for
// servers: the CPU of their containers, summed (a container that several
// of them share, as a Redis Cluster's nodes do, counted once). Commands
// are not counted (Redis' own probe counts them: see integration/redis).
func ScaleUsage(servers ...*Server) func(context.Context) (benchmark.Usage, error) {
	return func(ctx context.Context) (benchmark.Usage, error) {
		var u benchmark.Usage
		seen := map[*testcontainers.DockerContainer]bool{}
		for _, s := range servers {
			s.mu.Lock()
			ctr := s.ctr
			s.mu.Unlock()
			if ctr != nil && seen[ctr] {
				continue
			}
			seen[ctr] = true
			cpu, err := s.CPU(ctx)
			if err != nil {
				return u, err
			}
			u.CPU += cpu
		}
		return u, nil
	}
}

// RedisUsage is the Usage probe of conformance/benchmark.RunScale for the
// Redis servers at addrs, summed: their CPU (INFO cpu: used_cpu_user +
// used_cpu_sys, the whole process), the commands they have run (INFO
// commandstats: every command's calls, those inside scripts included; the
// INFO calls themselves left out) and their time in scripts (the usec of
// EVALSHA and EVAL). Its clients are closed at the end of tb.
func RedisUsage(tb testing.TB, addrs ...string) func(context.Context) (benchmark.Usage, error) {
	admins := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		admins[i] = redis.NewClient(&redis.Options{Addr: a})
		tb.Cleanup(func() { _ = admins[i].Close() })
	}
	return func(ctx context.Context) (benchmark.Usage, error) {
		var u benchmark.Usage
		for _, c := range admins {
			if err := addRedisUsage(ctx, c, &u); err != nil {
				return u, err
			}
		}
		return u, nil
	}
}

func addRedisUsage(ctx context.Context, admin *redis.Client, u *benchmark.Usage) error {
	info, err := admin.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		return err
	}
	for _, line := range strings.Split(info, "\n") {
		name, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch {
		case name == "used_cpu_user" || name == "used_cpu_sys":
			s, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return fmt.Errorf("INFO cpu: %s: %w", line, err)
			}
			u.CPU += time.Duration(s * float64(time.Second))
		case strings.HasPrefix(name, "cmdstat_") && name != "cmdstat_info":
			for _, f := range strings.Split(val, ",") {
				if v, ok := strings.CutPrefix(f, "calls="); ok {
					n, _ := strconv.ParseInt(v, 10, 64)
					u.Commands += n
				}
				if v, ok := strings.CutPrefix(f, "usec="); ok && (name == "cmdstat_evalsha" || name == "cmdstat_eval") {
					n, _ := strconv.ParseInt(v, 10, 64)
					u.Scripts += time.Duration(n) * time.Microsecond
				}
			}
		}
	}
	return nil
}
