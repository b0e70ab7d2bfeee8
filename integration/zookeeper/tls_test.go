package zookeeper_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/zookeeper"
)

// The least privilege of the ZooKeeper Locker: its identity (digest
// auth) has CREATE, READ and DELETE on the lock root, which an operator
// made (the Locker makes the lock directories under it, lists them, and
// deletes them when it cannot use container nodes), and nothing above it:
// the root's parent grants the world READ only. The nodes the Locker
// creates carry WithACL: zk.AuthACL(zk.PermAll), its own identity.
const (
	zkParent      = "/locker-tls-parent"
	zkRoot        = zkParent + "/locks"
	zkUser        = "locker-app"
	zkPassword    = "pw-Zk7-locker-app"
	zkAdmin       = "admin"
	zkAdminPass   = "pw-Zk1-admin"
	zkRootRights  = zk.PermCreate | zk.PermRead | zk.PermDelete
	zkWrongPass   = "pw-wrong-Zk0"
	zkOtherUser   = "other-app"
	zkOtherPasswd = "pw-Zk9-other-app"
)

type secureZK struct {
	secure string          // the TLS port
	ca     *testserver.CA  // nil in a child process
	client testserver.Cert // the zero Cert in a child process
	admin  *zk.Conn        // digest admin and the Locker's identity: may delete its nodes
	files  string          // directory of ca.pem, client.pem, client.key
}

// envSecureZK hands the server of TestTLSConformance ("TLS addr|directory
// of the client files") to the child processes of its Process cases,
// which must lock on the same server.
const envSecureZK = "LOCKER_TEST_SECURE_ZOOKEEPER"

func newSecureZK(t *testing.T) *secureZK {
	t.Helper()
	if v := os.Getenv(envSecureZK); v != "" {
		addr, dir, _ := strings.Cut(v, "|")
		return &secureZK{secure: addr, files: dir}
	}
	ca := testserver.NewCA(t, "locker zookeeper test CA")
	srv := testserver.NewZooKeeperTLS(t, ca)
	s := &secureZK{secure: srv.SecureAddr, ca: ca, client: ca.ClientCert(t, "locker-client"), files: t.TempDir()}
	other := ca.ClientCert(t, "other-client")
	for name, data := range map[string][]byte{"ca.pem": ca.PEM(), "client.pem": s.client.CertPEM, "client.key": s.client.KeyPEM,
		"other.pem": other.CertPEM, "other.key": other.KeyPEM} {
		if err := os.WriteFile(filepath.Join(s.files, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s.admin = adminConn(t, srv.Addr())
	for _, id := range []string{zkAdmin + ":" + zkAdminPass, zkUser + ":" + zkPassword} {
		if err := s.admin.AddAuth("digest", []byte(id)); err != nil {
			t.Fatalf("AddAuth: %v", err)
		}
	}
	adminAll := zk.DigestACL(zk.PermAll, zkAdmin, zkAdminPass)
	parentACL := append(zk.WorldACL(zk.PermRead), adminAll...)
	rootACL := append(zk.DigestACL(zkRootRights, zkUser, zkPassword), adminAll...)
	if _, err := s.admin.Create(zkParent, nil, 0, parentACL); err != nil {
		t.Fatalf("create %s: %v", zkParent, err)
	}
	if _, err := s.admin.Create(zkRoot, nil, 0, rootACL); err != nil {
		t.Fatalf("create %s: %v", zkRoot, err)
	}
	return s
}

func (s *secureZK) opts(t testing.TB, user, password string) []zookeeper.Option {
	return []zookeeper.Option{
		zookeeper.WithTLS(testserver.ClientTLSFromDir(t, s.files)),
		zookeeper.WithAuth("digest", []byte(user+":"+password)),
		zookeeper.WithACL(zk.AuthACL(zk.PermAll)...),
		zookeeper.WithPrefix(zkRoot),
	}
}

func (s *secureZK) url(user, password, query string) string {
	return s.urlCert("client", user, password, query)
}

// urlCert is url with the client certificate cert (.pem, .key).
func (s *secureZK) urlCert(cert, user, password, query string) string {
	q := url.Values{}
	q.Set("tls_ca", filepath.Join(s.files, "ca.pem"))
	q.Set("tls_cert", filepath.Join(s.files, cert+".pem"))
	q.Set("tls_key", filepath.Join(s.files, cert+".key"))
	q.Set("acl", "creator")
	return "zookeeper+tls://" + url.UserPassword(user, password).String() + "@" + s.secure + zkRoot + "?" + q.Encode() + query
}

// TestTLSConformance runs the conformance suite over the secure client
// port with a client certificate, as an identity that has only CREATE,
// READ and DELETE on the lock root (and READ above it).
func TestTLSConformance(t *testing.T) {
	s := newSecureZK(t)
	t.Setenv(envSecureZK, s.secure+"|"+s.files)
	var reg testserver.Registry[*testserver.Proxy]
	conformance.Run(t, conformance.Harness{
		Only:             testserver.SecurityCases, // all with LOCKER_CONFORMANCE_FULL=1
		IgnoreGoroutines: testserver.ProxyGoroutines,
		// No WithDefaultTTL: TTL/Default checks the default.
		NewLocker: func(t *testing.T) locker.Locker {
			px := testserver.NewProxy(t, s.secure)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			l, err := zookeeper.Connect(ctx, []string{px.Addr()}, s.opts(t, zkUser, zkPassword)...)
			if err != nil {
				t.Fatalf("zookeeper.Connect: %v", err)
			}
			t.Cleanup(func() { _ = l.Close() })
			reg.Put(l, px)
			return l
		},
		Crash: func(t *testing.T, l locker.Locker) { reg.Get(t, l, "Crash").Crash(t) },
		Cut: func(t *testing.T, l locker.Locker) func() {
			px := reg.Get(t, l, "Cut")
			px.Blackhole(t)
			return func() { px.Heal(t) }
		},
		Reset: func(t *testing.T, l locker.Locker) { reg.Get(t, l, "Reset").ResetAll(t) },
		Steal: func(t *testing.T, h locker.Handle) {
			if err := s.admin.Delete(h.(*zookeeper.Handle).Node(), -1); err != nil {
				t.Fatalf("Steal: delete %s: %v", h.(*zookeeper.Handle).Node(), err)
			}
		},
		LossBound:      time.Second,
		URL:            s.url(zkUser, zkPassword, "&ttl="+sessionTimeout.String()),
		TTL:            2 * time.Second,
		LeaseFloor:     time.Second,
		LeaseCeiling:   10 * time.Second,
		NoInspectLease: "a node's stat names its session, not the session's timeout",
		ExpiryBound:    2 * sessionTimeout,
		ExpirySlack:    time.Second,
		CtxSlack:       1200 * time.Millisecond,
	})
}

// TestTLSRefusals: clients the server or the ACLs refuse fail with an
// error that says why and shows no secret.
func TestTLSRefusals(t *testing.T) {
	s := newSecureZK(t)
	secrets := []string{zkPassword, zkAdminPass, zkWrongPass, zkOtherPasswd, string(s.client.KeyPEM)}
	noSecret := func(t *testing.T, err error) {
		t.Helper()
		for _, sec := range secrets {
			if strings.Contains(err.Error(), sec) {
				t.Errorf("the error shows a secret: %v", err)
			}
		}
	}
	first := func(t *testing.T, l locker.Locker, key ...string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		k := "tls/refusals"
		if len(key) > 0 {
			k = key[0]
		}
		h, err := l.TryAcquire(ctx, k)
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
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l, err := locker.Open(ctx, rawURL)
		if err == nil {
			t.Cleanup(func() { _ = l.Close() })
		}
		return l, err
	}

	t.Run("Good", func(t *testing.T) {
		l, err := open(t, s.url(zkUser, zkPassword, ""))
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		if err := first(t, l); err != nil {
			t.Fatalf("the identity with rights on the root: %v", err)
		}
	})
	// The others try the key Good took, whose lock directory exists (a
	// container node, its ACL Good's identities), and a fresh one.
	keys := []string{"tls/refusals", "tls/refusals-fresh"}
	t.Run("OtherCA", func(t *testing.T) {
		other := testserver.NewCA(t, "another CA")
		otherCA := filepath.Join(t.TempDir(), "other-ca.pem")
		if err := os.WriteFile(otherCA, other.PEM(), 0o600); err != nil {
			t.Fatal(err)
		}
		q := url.Values{"tls_ca": {otherCA}, "tls_cert": {filepath.Join(s.files, "client.pem")}, "tls_key": {filepath.Join(s.files, "client.key")}}
		_, err := open(t, "zookeeper+tls://"+zkUser+":"+zkPassword+"@"+s.secure+zkRoot+"?"+q.Encode())
		if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
			t.Fatalf("a server certificate of another CA: %v, want an error naming the certificate problem", err)
		}
		noSecret(t, err)
		t.Logf("other CA: %v", err)
	})
	t.Run("NoClientCert", func(t *testing.T) {
		q := url.Values{"tls_ca": {filepath.Join(s.files, "ca.pem")}}
		_, err := open(t, "zookeeper+tls://"+zkUser+":"+zkPassword+"@"+s.secure+zkRoot+"?"+q.Encode())
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("a client without a certificate: %v, want an error saying the server wants one", err)
		}
		noSecret(t, err)
		t.Logf("no client certificate: %v", err)
	})
	t.Run("PlainToSecurePort", func(t *testing.T) {
		_, err := open(t, "zookeeper://"+s.secure+zkRoot)
		if err == nil {
			t.Fatal("plain zookeeper:// to the secure port connected")
		}
		t.Logf("plain to the secure port: %v", err)
	})
	// ZooKeeper's digest auth takes any password (it only names an
	// identity): a wrong one, like another user's, is refused by the
	// ACLs at the first call. Each client has a certificate of its own:
	// a TLS session also has the x509 identity of its certificate, which
	// zk.AuthACL (acl=creator) grants the nodes to as well.
	for _, c := range []struct{ name, user, password string }{
		{"WrongPassword", zkUser, zkWrongPass},
		{"NoRights", zkOtherUser, zkOtherPasswd},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, err := open(t, s.urlCert("other", c.user, c.password, ""))
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			for _, k := range keys {
				err = first(t, l, k)
				if err == nil || !errors.Is(err, zk.ErrNoAuth) || !strings.Contains(err.Error(), zkRoot) {
					t.Fatalf("first call on %q: %v, want an error wrapping zk.ErrNoAuth that names the root", k, err)
				}
				noSecret(t, err)
				t.Logf("%s, %q: %v", c.name, k, err)
			}
		})
	}
	t.Run("URLErrors", func(t *testing.T) {
		for _, u := range []string{
			"zookeeper://" + s.secure + "?tls_ca=" + filepath.Join(s.files, "ca.pem"),
			"zookeeper+tls://" + s.secure + "?tls_key=" + filepath.Join(s.files, "client.key"),
			"zookeeper+tls://" + s.secure + "?tls_ca=" + filepath.Join(s.files, "missing.pem"),
		} {
			_, err := locker.Open(context.Background(), u)
			if !errors.Is(err, locker.ErrInvalidURL) {
				t.Errorf("Open(%s): %v, want an error wrapping ErrInvalidURL", u, err)
			}
		}
	})
}
