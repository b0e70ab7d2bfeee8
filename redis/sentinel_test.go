package redis

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
)

// startLocalRedis runs the redis-server binary with args on 127.0.0.1 and
// waits until addr answers PING. The test-server provider has no Sentinel
// or TLS variant, so these tests start their own; they skip without the
// binary.
func startLocalRedis(t *testing.T, addr string, args ...string) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("no redis-server binary on PATH; install redis-server to run this test")
	}
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	ctx := testCtx(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Ping(ctx).Err()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server %v did not answer at %s: %v", args, addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestURLSentinel: redis+sentinel:// finds the master through a Sentinel
// and takes locks on it.
func TestURLSentinel(t *testing.T) {
	dir := t.TempDir()
	master := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	_, masterPort, _ := net.SplitHostPort(master)
	startLocalRedis(t, master, "--bind", "127.0.0.1", "--port", masterPort, "--save", "", "--appendonly", "no", "--dir", dir)

	sentinelPort := freePort(t)
	conf := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(
		"bind 127.0.0.1\nport %d\ndir %s\nsentinel monitor mymaster 127.0.0.1 %s 1\n",
		sentinelPort, dir, masterPort)), 0o600); err != nil {
		t.Fatal(err)
	}
	sentinel := fmt.Sprintf("127.0.0.1:%d", sentinelPort)
	startLocalRedis(t, sentinel, conf, "--sentinel")

	ctx := testCtx(t)
	l, err := locker.Open(ctx, "redis+sentinel://"+sentinel+"?master_name=mymaster&ttl=5s&dial_timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h, err := l.Acquire(ctx, "sentinel/job")
	if err != nil {
		t.Fatalf("Acquire through Sentinel: %v", err)
	}
	// The lock is on the master the Sentinel named.
	mc := goredis.NewClient(&goredis.Options{Addr: master})
	defer mc.Close()
	if n := mc.Exists(ctx, l.(*Locker).keysFor("sentinel/job").lock).Val(); n != 1 {
		t.Errorf("lock not found on the master")
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
