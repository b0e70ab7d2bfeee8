package testserver

import (
	"context"
	"net/http/httptrace"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
)

func TestHostPortFromDSN(t *testing.T) {
	for _, c := range []struct{ kind, dsn, want string }{
		{kindPostgres, "postgres://u:p@127.0.0.1:5433/db?sslmode=disable", "127.0.0.1:5433"},
		{kindPostgres, "postgresql://u@localhost/db", "localhost:5432"},
		{kindPostgres, "host=127.0.0.1 port=6000 user=u dbname=d", "127.0.0.1:6000"},
		{kindMySQL, "u:p@tcp(127.0.0.1:3307)/db", "127.0.0.1:3307"},
		{kindMySQL, "u:p@tcp(127.0.0.1:3307)/db?parseTime=true", "127.0.0.1:3307"},
	} {
		if got := hostPortFromDSN(c.kind, c.dsn); got != c.want {
			t.Errorf("hostPortFromDSN(%s, %q) = %q, want %q", c.kind, c.dsn, got, c.want)
		}
	}
}

// The local image tag computed here must be the one scripts/docker-up.sh builds.
func TestLocalImageTagMatchesScript(t *testing.T) {
	for _, tool := range []string{"sh", "find", "sort", "xargs", "sha256sum", "cut"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found", tool)
		}
	}
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..", "build", "docker")
	cmd := exec.Command("sh", "-c", "find . -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-12")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	got, err := hashDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.TrimSpace(string(out)); got != want {
		t.Fatalf("hashDir = %s, the script computes %s", got, want)
	}
	t.Setenv("LOCKER_TEST_LOCAL_IMAGE", "")
	if img := localImage(); img != "locker/testserver:"+got {
		t.Fatalf("localImage() = %s", img)
	}
}

// Every kind comes back on the same address after a crash (Kill) and after a graceful
// Stop: the entry script must cope with the lock and pid files a crash leaves.
func TestKillStopStartEveryKind(t *testing.T) {
	for _, kind := range []string{kindPostgres, kindMySQL, kindZooKeeper, kindEtcd} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			s, err := startServer(kind)
			if err != nil {
				unavailable(t, kind, "", err)
			}
			t.Cleanup(func() { terminate(s) })
			addr := s.Addr()
			s.Kill(t)
			s.Start(t) // waits for a real ping
			s.Stop(t)
			s.Start(t)
			if s.Addr() != addr {
				t.Fatalf("address changed from %s to %s", addr, s.Addr())
			}
		})
	}
	t.Run("redis-cluster", func(t *testing.T) {
		t.Parallel()
		nodes, err := startRedisCluster()
		if err != nil {
			unavailable(t, "redis cluster", "", err)
		}
		t.Cleanup(func() { terminate(nodes[0]) })
		nodes[1].Kill(t)
		nodes[1].Start(t) // waits until every node reports cluster_state:ok
	})
}

// TestCPUPaths: the container's CPU read from its cgroup's file (what CPU
// uses on the engine's host) agrees with the engine's stats: a stats
// sample taken between two reads of the file lies between them.
func TestCPUPaths(t *testing.T) {
	s := Redis(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := s.ctr.GetContainerID()
	before, ok := cgroupCPU(id)
	if !ok {
		t.Skip("no cgroup file for the container on this host (an engine in a VM): CPU reads the engine's stats")
	}
	stats, err := s.statsCPU(ctx, s.ctr)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := cgroupCPU(id)
	t.Logf("cgroup %v, stats %v, cgroup %v", before, stats, after)
	if stats < before || stats > after {
		t.Errorf("the engine's stats say %v of CPU, outside the cgroup's %v..%v read before and after", stats, before, after)
	}
}

// TestProviderCloseKeepsConnections: testcontainers closes its provider's
// client after most of its calls (a container's Start, Stop and Terminate,
// the provider's CreateContainer: testcontainers-go issue 2776), and closing
// a Docker client closes every idle connection of its transport. The engine's
// provider is shared by every server a test binary starts, many at once, so
// one test's Close broke another's request in flight: a CI rehearsal of
// 738dbea failed in TestKillStopStartEveryKind/zookeeper with "container
// start: ... net/http: HTTP/1.x transport connection broken: http:
// CloseIdleConnections called".
// The shared client's connections must outlive testcontainers' Close: a
// request after it reuses the idle connection of the one before.
func TestProviderCloseKeepsConnections(t *testing.T) {
	e, err := getEngine()
	if err != nil {
		unavailable(t, "docker", "", err)
	}
	ping := func() (reused bool) {
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused },
		})
		if _, err := e.api.Ping(ctx, client.PingOptions{}); err != nil {
			t.Fatal(err)
		}
		return reused
	}
	ping()
	if !ping() {
		t.Fatal("a second ping did not reuse the first one's connection: the test cannot tell a closed connection from a new one")
	}
	_ = e.provider.Close() // as testcontainers does after its calls
	if !ping() {
		t.Fatal("the provider's Close (which testcontainers calls after most of its calls) closed the idle connections of the Docker client every server of the test binary shares: requests in flight on them fail")
	}
}
