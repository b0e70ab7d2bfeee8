package testserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
)

// kindEtcdTLS is an etcd server that speaks only TLS to its clients and
// asks each for a certificate of the test's CA.
const kindEtcdTLS = "etcd-tls"

// tlsPing holds the client configuration that pings a TLS server, by its
// address (filled in before the container starts).
var tlsPing sync.Map // addr → *tls.Config

// certFiles are the PEM files a TLS server gets, under /tls in its
// container: ca.pem (the CA), server.pem (its certificate, then the CA's),
// server.key, and server-full.pem (key and certificate in one, for
// ZooKeeper's PEM key store).
func certFiles(t testing.TB, ca *CA) []testcontainers.ContainerFile {
	t.Helper()
	srv := ca.ServerCert(t)
	file := func(name string, data []byte) testcontainers.ContainerFile {
		return testcontainers.ContainerFile{Reader: bytes.NewReader(data), ContainerFilePath: "/tls/" + name, FileMode: 0o644}
	}
	return []testcontainers.ContainerFile{
		file("ca.pem", ca.PEM()),
		file("server.pem", srv.CertPEM),
		file("server.key", srv.KeyPEM),
		file("server-full.pem", append(append([]byte{}, srv.KeyPEM...), srv.CertPEM...)),
	}
}

// NewEtcdTLS returns a fresh etcd server private to the test, removed at
// t.Cleanup, that serves its clients over TLS only (https://Addr) with a
// server certificate of ca for 127.0.0.1 and localhost, and refuses a
// client without a certificate of ca (--client-cert-auth). Auth is not
// enabled: the test does that through the client's Auth API. It is always
// a container of its own (LOCKER_TEST_ETCD_ADDR names a plain server); with
// no Docker engine the test skips, or fails with LOCKER_REQUIRE_SERVERS=1.
func NewEtcdTLS(t testing.TB, ca *CA) *Server {
	t.Helper()
	files := certFiles(t, ca)
	ping := ca.ClientTLS(t, ca.ClientCert(t, "testserver-ping"))
	s, err := startServerWith(kindEtcdTLS, func(e *engine, sp *spec, ports []int, _ *Server) error {
		p, peer := ports[0], ports[1]
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		tlsPing.Store(addr, ping)
		flags := []string{"--name", "locker", "--log-level", "warn",
			"--cert-file", "/tls/server.pem", "--key-file", "/tls/server.key",
			"--trusted-ca-file", "/tls/ca.pem", "--client-cert-auth"}
		sp.ctrFiles = files
		if e.profile == profileLocal {
			sp.image, sp.entrypoint = e.image, []string{"/usr/local/bin/etcd"}
			sp.cmd = append(flags, "--data-dir", "/srv/etcd",
				"--listen-client-urls", "https://"+addr, "--advertise-client-urls", "https://"+addr,
				"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peer),
				"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peer),
				"--initial-cluster", fmt.Sprintf("locker=http://127.0.0.1:%d", peer))
			return nil
		}
		sp.image, sp.entrypoint = officialImage(kindEtcd), nil
		sp.cmd = append([]string{"etcd"}, append(flags, "--data-dir", "/tmp/etcd",
			"--listen-client-urls", "https://0.0.0.0:2379", "--advertise-client-urls", "https://"+addr)...)
		sp.bind = map[int]string{p: "2379/tcp"}
		return nil
	})
	if err != nil {
		unavailable(t, "TLS etcd", EnvEtcdAddr, err)
	}
	t.Cleanup(func() { terminate(s) })
	return s
}

// pingEtcdTLS asks a TLS etcd server for /health with a client certificate.
func pingEtcdTLS(ctx context.Context, addr string) error {
	v, ok := tlsPing.Load(addr)
	if !ok {
		return fmt.Errorf("no TLS configuration for %s", addr)
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: v.(*tls.Config)}}
	defer c.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var h struct {
		Health string `json:"health"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return fmt.Errorf("etcd /health: %w", err)
	}
	if h.Health != "true" {
		return fmt.Errorf("etcd /health: %q", h.Health)
	}
	return nil
}

// ZooKeeperTLS is a ZooKeeper server with a TLS client port beside its
// plain one.
type ZooKeeperTLS struct {
	*Server           // Addr: the plain client port
	SecureAddr string // 127.0.0.1:port of the TLS client port
}

// NewZooKeeperTLS returns a fresh ZooKeeper server private to the test,
// removed at t.Cleanup, with a secure client port (the Netty connection
// factory, PEM key and trust stores: a server certificate of ca for
// 127.0.0.1 and localhost) that needs a client certificate of ca
// (ssl.clientAuth=need), beside its plain port (Addr, for the test's own
// set-up). Like NewEtcdTLS it is always a container of its own.
func NewZooKeeperTLS(t testing.TB, ca *CA) *ZooKeeperTLS {
	t.Helper()
	files := certFiles(t, ca)
	var secure string
	s, err := startServerWith(kindZooKeeper, func(e *engine, sp *spec, ports []int, srv *Server) error {
		inPort, extra := 2182, []string(nil)
		if e.profile == profileLocal {
			inPort, extra = ports[1], []string{"secureClientPortAddress=127.0.0.1"}
		} else {
			sp.bind[ports[1]] = "2182/tcp"
		}
		secure = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
		if err := zooCfgExtra(append([]string{
			"serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
			"secureClientPort=" + strconv.Itoa(inPort),
			"ssl.keyStore.location=/tls/server-full.pem", "ssl.keyStore.type=PEM",
			"ssl.trustStore.location=/tls/ca.pem", "ssl.trustStore.type=PEM",
			"ssl.clientAuth=need",
		}, extra...))(e, sp, ports, srv); err != nil {
			return err
		}
		if e.profile == profileLocal {
			// Debian's zookeeper.jar names only part of Netty in its class
			// path: the secure port needs its codec and handler too.
			sp.entrypoint[2] = strings.Replace(sp.entrypoint[2], "exec sh /tmp/locker-serve-zk",
				"sed -i 's#/usr/share/java/zookeeper.jar#&:/usr/share/java/netty-codec.jar:/usr/share/java/netty-handler.jar#' /tmp/locker-serve-zk\nexec sh /tmp/locker-serve-zk", 1)
		}
		sp.ctrFiles = files
		return nil
	})
	if err != nil {
		unavailable(t, "TLS zookeeper", EnvZooKeeperAddr, err)
	}
	t.Cleanup(func() { terminate(s) })
	z := &ZooKeeperTLS{Server: s, SecureAddr: secure}
	// The secure port opens with the plain one; wait for its handshake.
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	cfg := ca.ClientTLS(t, ca.ClientCert(t, "testserver-ping"))
	for {
		d := tls.Dialer{Config: cfg}
		c, err := d.DialContext(ctx, "tcp", secure)
		if err == nil {
			_ = c.Close()
			return z
		}
		if ctx.Err() != nil {
			t.Fatalf("testserver: the TLS port %s of %s never answered: %v\n%s", secure, s, err, containerLogs(s.ctr))
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}
