package etcd_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/etcd"
	"github.com/go-locker/locker/integration/testserver"
)

// secureEtcd is a TLS etcd server with client-certificate auth and etcd's
// auth enabled: root, a user whose role is limited to the Locker's prefix
// (the least privilege the Locker needs), and one whose role covers
// another prefix only.
type secureEtcd struct {
	addr   string
	ca     *testserver.CA   // nil in a child process
	client testserver.Cert  // the zero Cert in a child process
	admin  *clientv3.Client // root
	files  string           // directory of ca.pem, client.pem, client.key
}

// envSecureEtcd hands the server of TestTLSConformance, as
// "addr|directory of the client files", to the child processes of its
// Process cases (the test binary run again), which must lock on the same
// server: a private server is not inherited as the shared ones are.
const envSecureEtcd = "LOCKER_TEST_SECURE_ETCD"

const (
	tlsPrefix     = "/locker-tls"
	tlsUser       = "locker-app"
	tlsPassword   = "pw-Xq7-locker-app"
	otherUser     = "other-app"
	otherPassword = "pw-Zz9-other-app"
	rootPassword  = "pw-Rr1-root"
)

func newSecureEtcd(t *testing.T) *secureEtcd {
	t.Helper()
	if v := os.Getenv(envSecureEtcd); v != "" {
		addr, dir, _ := strings.Cut(v, "|")
		s := &secureEtcd{addr: addr, files: dir}
		s.admin = s.dial(t, addr, s.tls(t), "root", rootPassword)
		return s
	}
	ca := testserver.NewCA(t, "locker etcd test CA")
	s := &secureEtcd{addr: testserver.NewEtcdTLS(t, ca).Addr(), ca: ca, client: ca.ClientCert(t, tlsUser), files: t.TempDir()}
	for name, data := range map[string][]byte{"ca.pem": ca.PEM(), "client.pem": s.client.CertPEM, "client.key": s.client.KeyPEM} {
		if err := os.WriteFile(filepath.Join(s.files, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx := testCtx(t, time.Minute)
	boot := s.dial(t, s.addr, s.tls(t), "", "")
	auth := []func() error{
		func() error { _, err := boot.UserAdd(ctx, "root", rootPassword); return err },
		func() error { _, err := boot.UserGrantRole(ctx, "root", "root"); return err },
		// The Locker's role: read and write on its prefix's range, nothing else
		// (etcdctl role grant-permission locker readwrite --prefix /locker-tls/).
		func() error { _, err := boot.RoleAdd(ctx, "locker"); return err },
		func() error {
			_, err := boot.RoleGrantPermission(ctx, "locker", tlsPrefix+"/", clientv3.GetPrefixRangeEnd(tlsPrefix+"/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := boot.UserAdd(ctx, tlsUser, tlsPassword); return err },
		func() error { _, err := boot.UserGrantRole(ctx, tlsUser, "locker"); return err },
		func() error { _, err := boot.RoleAdd(ctx, "other"); return err },
		func() error {
			_, err := boot.RoleGrantPermission(ctx, "other", "/other/", clientv3.GetPrefixRangeEnd("/other/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := boot.UserAdd(ctx, otherUser, otherPassword); return err },
		func() error { _, err := boot.UserGrantRole(ctx, otherUser, "other"); return err },
		func() error { _, err := boot.AuthEnable(ctx); return err },
	}
	for i, f := range auth {
		if err := f(); err != nil {
			t.Fatalf("auth set-up step %d: %v", i, err)
		}
	}
	s.admin = s.dial(t, s.addr, s.tls(t), "root", rootPassword)
	return s
}

// tls is a client configuration that trusts the test CA and presents the
// client certificate, from the files.
func (s *secureEtcd) tls(t testing.TB) *tls.Config {
	t.Helper()
	return testserver.ClientTLSFromDir(t, s.files)
}

func (s *secureEtcd) dial(t testing.TB, addr string, cfg *tls.Config, user, password string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints: []string{"https://" + addr}, TLS: cfg, Username: user, Password: password,
		DialTimeout: 5 * time.Second, DialKeepAliveTime: time.Second, DialKeepAliveTimeout: time.Second,
		Logger: zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("clientv3.New as %q: %v", user, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// url is an etcds:// URL of the server for user, with the client
// certificate files.
func (s *secureEtcd) url(user, password string, query string) string {
	q := url.Values{}
	q.Set("tls_ca", filepath.Join(s.files, "ca.pem"))
	q.Set("tls_cert", filepath.Join(s.files, "client.pem"))
	q.Set("tls_key", filepath.Join(s.files, "client.key"))
	return "etcds://" + url.UserPassword(user, password).String() + "@" + s.addr + tlsPrefix + "?" + q.Encode() + query
}

// certURL is an etcds:// URL without user: the client certificate names
// the user.
func (s *secureEtcd) certURL(query string) string {
	q := url.Values{}
	q.Set("tls_ca", filepath.Join(s.files, "ca.pem"))
	q.Set("tls_cert", filepath.Join(s.files, "client.pem"))
	q.Set("tls_key", filepath.Join(s.files, "client.key"))
	return "etcds://" + s.addr + tlsPrefix + "?" + q.Encode() + query
}

// TestTLSConformance runs the conformance suite over TLS with client
// certificates, as a user whose role grants read and write on the Locker's
// prefix and nothing else: the least privilege the etcd Locker needs. The
// user is the certificate's common name (--client-cert-auth with auth
// enabled), with no password: with a password, etcd's client logs in again
// (Authenticate: a bcrypt compare and a raft entry on the server) for every
// stream it opens, every renewal's KeepAliveOnce included, which took
// 130-800ms per renewal here against 1-7ms without, and made 2s leases
// lapse. TestTLSRefusals covers password logins.
func TestTLSConformance(t *testing.T) {
	s := newSecureEtcd(t)
	t.Setenv(envSecureEtcd, s.addr+"|"+s.files)
	var reg testserver.Registry[*testserver.Proxy]
	conformance.Run(t, conformance.Harness{
		Only:             testserver.SecurityCases, // all with LOCKER_CONFORMANCE_FULL=1
		IgnoreGoroutines: testserver.ProxyGoroutines,
		NewLocker: func(t *testing.T) locker.Locker {
			px := testserver.NewProxy(t, s.addr)
			l := etcd.New(s.dial(t, px.Addr(), s.tls(t), "", ""), etcd.WithPrefix(tlsPrefix))
			t.Cleanup(func() { _ = l.Close() })
			reg.Put(l, px)
			return l
		},
		Crash: func(t *testing.T, l locker.Locker) { reg.Get(t, l, "Crash").Crash(t) },
		Reset: func(t *testing.T, l locker.Locker) { reg.Get(t, l, "Reset").ResetAll(t) },
		Cut: func(t *testing.T, l locker.Locker) func() {
			px := reg.Get(t, l, "Cut")
			px.Partition(t)
			return func() { px.Heal(t) }
		},
		Steal: func(t *testing.T, h locker.Handle) {
			k := h.(*etcd.Handle).EtcdKey()
			if _, err := s.admin.Delete(testCtx(t, 10*time.Second), k); err != nil {
				t.Fatalf("Steal: delete %s: %v", k, err)
			}
		},
		LossBound:   time.Second,
		URL:         s.certURL("&ttl=" + ttl.String()),
		TTL:         ttl,
		LeaseGrain:  time.Second,
		LeaseFloor:  2 * time.Second,
		ExpiryBound: 3 * ttl,
	})
}

// TestTLSRefusals: a client the server must refuse fails with an error
// that says why and shows no secret: a server certificate of another CA,
// no client certificate, a wrong password, and a user without rights on
// the prefix (at the first call).
func TestTLSRefusals(t *testing.T) {
	s := newSecureEtcd(t)
	secrets := []string{tlsPassword, otherPassword, rootPassword, "wrong-pw-Q1", string(s.client.KeyPEM)}
	noSecret := func(t *testing.T, err error) {
		t.Helper()
		for _, sec := range secrets {
			if strings.Contains(err.Error(), sec) {
				t.Errorf("the error shows a secret: %v", err)
			}
		}
	}
	// first is the first call of a Locker: a TryAcquire of a fresh key.
	first := func(t *testing.T, l locker.Locker) error {
		ctx := testCtx(t, 10*time.Second)
		h, err := l.TryAcquire(ctx, "tls/refusals")
		if err == nil {
			_ = h.Release(ctx)
			return nil
		}
		if errors.Is(err, locker.ErrNotAcquired) {
			t.Errorf("TryAcquire: %v: ErrNotAcquired says another holder has the key; none has", err)
		}
		return err
	}
	open := func(t *testing.T, rawURL string) (locker.Locker, error) {
		t.Helper()
		l, err := locker.Open(testCtx(t, 30*time.Second), rawURL)
		if err == nil {
			t.Cleanup(func() { _ = l.Close() })
		}
		return l, err
	}

	t.Run("Good", func(t *testing.T) {
		l, err := open(t, s.url(tlsUser, tlsPassword, ""))
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		if err := first(t, l); err != nil {
			t.Fatalf("the user with the prefix role: %v", err)
		}
	})
	t.Run("CertificateUser", func(t *testing.T) {
		l, err := open(t, s.certURL(""))
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		if err := first(t, l); err != nil {
			t.Fatalf("the user named by the client certificate: %v", err)
		}
	})
	t.Run("OtherCA", func(t *testing.T) {
		other := testserver.NewCA(t, "another CA")
		otherCA := filepath.Join(t.TempDir(), "other-ca.pem")
		if err := os.WriteFile(otherCA, other.PEM(), 0o600); err != nil {
			t.Fatal(err)
		}
		q := url.Values{"tls_ca": {otherCA}, "tls_cert": {filepath.Join(s.files, "client.pem")}, "tls_key": {filepath.Join(s.files, "client.key")}}
		// With a user, Open logs in and fails; without one, the first call.
		for _, user := range []string{tlsUser + ":" + tlsPassword + "@", ""} {
			l, err := open(t, "etcds://"+user+s.addr+tlsPrefix+"?dial_timeout=3s&"+q.Encode())
			if err == nil {
				err = first(t, l)
			}
			if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
				t.Fatalf("a server certificate of another CA (user %t): %v, want an error naming the certificate problem", user != "", err)
			}
			noSecret(t, err)
			t.Logf("other CA (user %t): %v", user != "", err)
		}
		// A client of your own: what etcd's client says.
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{"https://" + s.addr}, TLS: other.ClientTLS(t, s.client),
			DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := first(t, etcd.New(c, etcd.WithPrefix(tlsPrefix))); err == nil {
			t.Fatal("a client trusting another CA took a lock")
		} else {
			t.Logf("other CA, a client of your own: %v", err)
		}
	})
	t.Run("NoClientCert", func(t *testing.T) {
		q := url.Values{"tls_ca": {filepath.Join(s.files, "ca.pem")}}
		l, err := open(t, "etcds://"+tlsUser+":"+tlsPassword+"@"+s.addr+tlsPrefix+"?dial_timeout=3s&"+q.Encode())
		if err == nil {
			err = first(t, l)
		}
		if err == nil || !strings.Contains(err.Error(), "certificate required") {
			t.Fatalf("a client without a certificate: %v, want an error saying the server requires one", err)
		}
		noSecret(t, err)
		t.Logf("no client certificate: %v", err)
	})
	t.Run("WrongPassword", func(t *testing.T) {
		l, err := open(t, s.url(tlsUser, "wrong-pw-Q1", "&dial_timeout=3s"))
		if err == nil {
			err = first(t, l)
		}
		if err == nil || !strings.Contains(err.Error(), "authentication failed") {
			t.Fatalf("a wrong password: %v, want an error saying the authentication failed", err)
		}
		noSecret(t, err)
		t.Logf("wrong password: %v", err)
	})
	t.Run("NoRights", func(t *testing.T) {
		l, err := open(t, s.url(otherUser, otherPassword, ""))
		if err != nil {
			t.Fatalf("Open as a user of another prefix: %v", err)
		}
		err = first(t, l)
		if err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Fatalf("first call as a user without rights on the prefix: %v, want a permission error", err)
		}
		noSecret(t, err)
		t.Logf("no rights: %v", err)
	})
	t.Run("PlainToTLS", func(t *testing.T) {
		l, err := open(t, "etcd://"+s.addr+tlsPrefix)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		if err := first(t, l); err == nil {
			t.Fatal("plain etcd:// to a TLS-only server took a lock")
		}
	})
	t.Run("URLErrors", func(t *testing.T) {
		for _, u := range []string{
			"etcd://" + s.addr + "?tls_ca=" + filepath.Join(s.files, "ca.pem"),
			"etcds://" + s.addr + "?tls_cert=" + filepath.Join(s.files, "client.pem"),
			"etcds://" + s.addr + "?tls_ca=" + filepath.Join(s.files, "client.key"),
			"etcds://" + s.addr + "?tls_ca=" + filepath.Join(s.files, "missing.pem"),
			"etcds://" + s.addr + "?tls_cert=" + filepath.Join(s.files, "ca.pem") + "&tls_key=" + filepath.Join(s.files, "client.key"),
		} {
			_, err := locker.Open(context.Background(), u)
			if !errors.Is(err, locker.ErrInvalidURL) {
				t.Errorf("Open(%s): %v, want an error wrapping ErrInvalidURL", u, err)
				continue
			}
			noSecret(t, err)
			t.Logf("%v", err)
		}
	})
}
