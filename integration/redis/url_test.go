package redis_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis"
)

// TestURLACLUser: an ACL user limited to its own prefix takes locks through
// a URL with user and password; a wrong password fails without echoing it.
func TestURLACLUser(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	admin := testClient(t, srv.Addr(), true)
	user := "locker-acl-" + strings.ToLower(randomID()[:8])
	pass := "pw-" + randomID()
	prefix := user + ":"
	// Only its own keys and channels; the commands the Locker needs.
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "reset", "on", ">"+pass,
		"~"+prefix+"*", "&"+prefix+"*",
		"+evalsha", "+eval", "+get", "+set", "+incr", "+pttl", "+del", "+exists", "+pexpire", "+time",
		"+zadd", "+zrem", "+zrange", "+zrangebyscore", "+zscore", "+zrank", "+zremrangebyrank",
		"+hget", "+hset", "+hdel", "+zcard", // the lock families
		"+publish", "+spublish", "+subscribe", "+unsubscribe", "+ping", "+hello", "+client",
	).Err(); err != nil {
		t.Skipf("ACL SETUSER: %v (server without ACLs?)", err)
	}
	t.Cleanup(func() { admin.Do(context.Background(), "ACL", "DELUSER", user) })

	u := url.URL{Scheme: "redis", User: url.UserPassword(user, pass), Host: srv.Addr(), Path: "/0",
		RawQuery: url.Values{"prefix": {prefix}, "ttl": {"5s"}}.Encode()}
	l, err := locker.Open(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h, err := l.Acquire(ctx, "acl/job")
	if err != nil {
		t.Fatalf("Acquire as ACL user: %v", err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The families, a waiter among them: the commands above are enough.
	for _, acquire := range []func(context.Context, string, ...locker.Option) (locker.Handle, error){
		locker.Semaphore(l, 1).Acquire, locker.WriteLock(l).Acquire,
	} {
		h, err := acquire(ctx, "acl/job")
		if err != nil {
			t.Fatalf("family Acquire as ACL user: %v", err)
		}
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		if _, err := acquire(wctx, "acl/job"); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a waiting family Acquire as ACL user: %v, want it to wait until its deadline", err)
		}
		cancel()
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The user may not step outside its prefix.
	l2, err := locker.Open(ctx, strings.Replace(u.String(), "prefix="+url.QueryEscape(prefix), "prefix=other%3A", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if _, err := l2.TryAcquire(ctx, "acl/job"); err == nil || errors.Is(err, locker.ErrNotAcquired) {
		t.Errorf("ACL user outside its key pattern: %v, want a permission error", err)
	}

	bad := u
	bad.User = url.UserPassword(user, "wrong-"+pass)
	l3, err := locker.Open(ctx, bad.String())
	if err != nil {
		t.Fatal(err)
	}
	defer l3.Close()
	_, err = l3.TryAcquire(ctx, "acl/job")
	if err == nil {
		t.Fatal("TryAcquire with a wrong password succeeded")
	}
	if strings.Contains(err.Error(), pass) {
		t.Errorf("error shows the password: %v", err)
	}
	t.Logf("wrong password: %v", err)
}

// TestURLTLS: rediss:// against a TLS-only redis-server that this test
// starts (the test-server provider has no TLS variant). Skips when no
// redis-server binary is installed.
func TestURLTLS(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("no redis-server binary on PATH for a TLS server; install redis-server to run this test")
	}
	dir := t.TempDir()
	caPEM := writeTLSFiles(t, dir)
	port := freePort(t)
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", "0", "--tls-port", fmt.Sprint(port),
		"--tls-cert-file", filepath.Join(dir, "server.crt"), "--tls-key-file", filepath.Join(dir, "server.key"),
		"--tls-ca-cert-file", filepath.Join(dir, "ca.crt"), "--tls-auth-clients", "no",
		"--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	ctx := testCtx(t)

	// A client that verifies the server against our CA.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	verified := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true,
		TLSConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}})
	defer verified.Close()
	deadline := time.Now().Add(10 * time.Second)
	for verified.Ping(ctx).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("TLS redis-server did not answer: %v", verified.Ping(ctx).Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
	l := redis.New(verified)
	defer l.Close()
	h, err := l.Acquire(ctx, "tls/job")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// By URL: the CA cannot travel in a URL, so skip_verify it is.
	lu, err := locker.Open(ctx, "rediss://"+addr+"?skip_verify=true")
	if err != nil {
		t.Fatal(err)
	}
	defer lu.Close()
	h, err = lu.Acquire(ctx, "tls/job")
	if err != nil {
		t.Fatalf("Acquire over rediss://: %v", err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Plain redis:// to a TLS port fails.
	lp, err := locker.Open(ctx, "redis://"+addr+"?dial_timeout=1s&read_timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	defer lp.Close()
	if _, err := lp.TryAcquire(ctx, "tls/job"); err == nil {
		t.Error("plain TCP to a TLS port succeeded")
	}
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// writeTLSFiles writes a CA and a server certificate for 127.0.0.1 and
// returns the CA in PEM.
func writeTLSFiles(t *testing.T, dir string) []byte {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "locker test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caTmpl, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(srvKey)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	for name, data := range map[string][]byte{
		"ca.crt":     caPEM,
		"server.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}),
		"server.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return caPEM
}

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
	lock, _, _ := l.(*redis.Locker).KeyNames("sentinel/job")
	if n := mc.Exists(ctx, lock).Val(); n != 1 {
		t.Errorf("lock not found on the master")
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The families too: a permit and a read lock, on the master.
	for fam, take := range map[string]func(context.Context, string, ...locker.Option) (locker.Handle, error){
		"sem": locker.Semaphore(l, 2).Acquire, "rw": locker.ReadLock(l).Acquire,
	} {
		h, err := take(ctx, "sentinel/job")
		if err != nil {
			t.Fatalf("%s: Acquire through Sentinel: %v", fam, err)
		}
		if n := mc.Exists(ctx, famName(l.(*redis.Locker), fam, "sentinel/job", "holders")).Val(); n != 1 {
			t.Errorf("%s: holders not found on the master", fam)
		}
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
