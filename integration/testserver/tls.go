package testserver

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	tcexec "github.com/testcontainers/testcontainers-go/exec"
)

// TLSFiles are a test CA made at run time and a server certificate it signed
// for 127.0.0.1, ::1 and localhost, as PEM files in one directory.
type TLSFiles struct {
	Dir      string
	CAFile   string // the CA certificate
	CertFile string // the server's certificate
	KeyFile  string // the server's private key (EC, PEM)
	CAPEM    []byte
	// Pool holds the CA alone: a tls.Config's RootCAs.
	Pool *x509.CertPool
}

// ClientConfig returns a client tls.Config that trusts only the test CA and
// checks that the server's certificate names serverName.
func (f *TLSFiles) ClientConfig(serverName string) *tls.Config {
	return &tls.Config{RootCAs: f.Pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
}

// NewTLSFiles makes a new test CA and server certificate in a temporary
// directory removed at the end of the test. Another call makes another CA:
// a client that trusts one refuses a server that the other signed.
func NewTLSFiles(t testing.TB) *TLSFiles {
	t.Helper()
	f, err := makeTLSFiles(t.TempDir())
	if err != nil {
		t.Fatalf("testserver: making a test CA: %v", err)
	}
	return f
}

// makeTLSFiles writes ca.crt, server.crt and server.key into dir. The
// certificates are valid from an hour ago for a day: long enough for the
// longest test binary, short enough to be worthless when left behind.
func makeTLSFiles(dir string) (*TLSFiles, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial := func() *big.Int {
		n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
		return n
	}
	caTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "locker test CA " + strconv.FormatInt(now.UnixNano(), 36)},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return nil, err
	}
	f := &TLSFiles{
		Dir: dir, CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "server.crt"), KeyFile: filepath.Join(dir, "server.key"),
		CAPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		Pool:  x509.NewCertPool(),
	}
	f.Pool.AddCert(ca)
	for path, data := range map[string][]byte{
		f.CAFile:   f.CAPEM,
		f.CertFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}),
		f.KeyFile:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// Where a TLS server finds its files: they are copied into the container at
// tlsIn (owned by root) and, at each start, to tlsDir owned by the server's
// user, mode 0600, as PostgreSQL wants its key.
const (
	tlsIn  = "/locker-tls-in"
	tlsDir = "/locker-tls"
)

// pgHBA makes a TLS PostgreSQL server take TCP connections only over TLS and
// with a password (SCRAM), and its own socket without one (the official
// image's set-up runs over it).
const pgHBA = `local all all trust
hostssl all all all scram-sha-256
hostnossl all all all reject
`

// The servers' extra settings for TLS.
var (
	pgTLSArgs = []string{"-c", "ssl=on", "-c", "ssl_cert_file=" + tlsDir + "/server.crt",
		"-c", "ssl_key_file=" + tlsDir + "/server.key", "-c", "ssl_ca_file=" + tlsDir + "/ca.crt",
		"-c", "hba_file=" + tlsDir + "/pg_hba.conf", "-c", "password_encryption=scram-sha-256"}
	mysqlTLSArgs = []string{"--ssl-cert=" + tlsDir + "/server.crt", "--ssl-key=" + tlsDir + "/server.key",
		"--ssl-ca=" + tlsDir + "/ca.crt", "--require-secure-transport=ON"}
)

// PostgresTLS returns a PostgreSQL server shared by the tests of this binary
// that takes TCP connections only over TLS, with a certificate from a test
// CA made at its start (TLS()), and only with the right password (SCRAM;
// the ordinary test servers trust every local connection). Its DSN uses
// sslmode=verify-full with sslrootcert naming the CA file. It always runs in
// a container: LOCKER_TEST_POSTGRES_DSN does not name a TLS server.
func PostgresTLS(t testing.TB) *Server {
	t.Helper()
	return sharedTLS(t, kindPostgres)
}

// MySQLTLS returns a MariaDB server shared by the tests of this binary that
// takes TCP connections only over TLS (require_secure_transport), with a
// certificate from a test CA made at its start (TLS()). Its DSN names a TLS
// configuration registered with the driver (mysql.RegisterTLSConfig) that
// trusts only that CA and checks the name 127.0.0.1.
func MySQLTLS(t testing.TB) *Server {
	t.Helper()
	return sharedTLS(t, kindMySQL)
}

// TLS returns the test CA and certificate of a server from PostgresTLS or
// MySQLTLS, nil for other servers.
func (s *Server) TLS() *TLSFiles { return s.tls }

// tlsEnv names the shared TLS server of kind that a test binary hands to
// the child processes it starts, through inheritVar(tlsEnv(kind)): the
// directory of its files, a newline, its DSN.
func tlsEnv(kind string) string { return "LOCKER_TEST_" + strings.ToUpper(kind) + "_TLS" }

func sharedTLS(t testing.TB, kind string) *Server {
	t.Helper()
	servers, err := getShared(kind+"-tls", func() ([]*Server, error) {
		if v := inherited(tlsEnv(kind)); v != "" {
			return inheritTLS(kind, v)
		}
		dir, err := os.MkdirTemp("", "locker-tls-")
		if err != nil {
			return nil, err
		}
		files, err := makeTLSFiles(dir)
		if err != nil {
			return nil, err
		}
		s, err := startServerWith(kind, withTLS(files))
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		s.tls = files
		tlsDirs.Add(dir)
		publish(tlsEnv(kind), dir+"\n"+s.DSN())
		return []*Server{s}, nil
	})
	if err != nil {
		unavailable(t, kind+" TLS", "", err) // no variable names a TLS server
	}
	return servers[0]
}

// inheritTLS is the shared TLS server a parent test process handed down
// (see tlsEnv): its files are read again, and a MySQL DSN's TLS
// configuration registered again under its name.
func inheritTLS(kind, v string) ([]*Server, error) {
	dir, dsn, _ := strings.Cut(v, "\n")
	files, err := loadTLSFiles(dir)
	if err != nil {
		return nil, fmt.Errorf("the TLS server handed down by the parent process: %w", err)
	}
	if kind == kindMySQL {
		// Registered before the DSN is parsed: the driver's parser
		// refuses a TLS configuration name it does not know.
		_, params, _ := strings.Cut(dsn, "?")
		q, err := url.ParseQuery(params)
		if err != nil || q.Get("tls") == "" {
			return nil, fmt.Errorf("the MySQL TLS server handed down has a DSN without tls=NAME")
		}
		if err := mysql.RegisterTLSConfig(q.Get("tls"), files.ClientConfig("127.0.0.1")); err != nil {
			return nil, err
		}
	}
	s := newEnvServer(kind, inheritVar(tlsEnv(kind)), dsn)
	s.tls = files
	return []*Server{s}, nil
}

// loadTLSFiles reads the files makeTLSFiles wrote into dir.
func loadTLSFiles(dir string) (*TLSFiles, error) {
	f := &TLSFiles{Dir: dir, CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "server.crt"), KeyFile: filepath.Join(dir, "server.key"), Pool: x509.NewCertPool()}
	var err error
	if f.CAPEM, err = os.ReadFile(f.CAFile); err != nil {
		return nil, err
	}
	if !f.Pool.AppendCertsFromPEM(f.CAPEM) {
		return nil, fmt.Errorf("%s holds no certificate", f.CAFile)
	}
	return f, nil
}

// tlsDirs are the directories of the shared TLS servers' files, removed by Main.
var tlsDirs dirList

// tlsConfigs numbers the TLS configurations registered with the MySQL driver.
var tlsConfigs atomic.Int64

// withTLS changes a PostgreSQL or MariaDB spec to serve TLS with files, and
// the server's DSN to use it.
func withTLS(files *TLSFiles) func(e *engine, sp *spec, ports []int, s *Server) error {
	return func(e *engine, sp *spec, ports []int, s *Server) error {
		sp.files = map[string]string{
			tlsIn + "/ca.crt":     files.CAFile,
			tlsIn + "/server.crt": files.CertFile,
			tlsIn + "/server.key": files.KeyFile,
		}
		user, args := "postgres", pgTLSArgs
		if s.kind == kindMySQL {
			user, args = "mysql", mysqlTLSArgs
		}
		hba := filepath.Join(files.Dir, "pg_hba.conf")
		if s.kind == kindPostgres {
			if err := os.WriteFile(hba, []byte(pgHBA), 0o600); err != nil {
				return err
			}
			sp.files[tlsIn+"/pg_hba.conf"] = hba
		}
		// Copy the files where the server's user owns them, then start the
		// server as the image would, with args added.
		install := fmt.Sprintf("set -eu; mkdir -p %[2]s; cp %[1]s/* %[2]s/; chown -R %[3]s %[2]s; chmod 0700 %[2]s; chmod 0600 %[2]s/*; ", tlsIn, tlsDir, user)
		if e.profile == profileLocal {
			// The local image's entry script ends the server's command line
			// with a fixed last setting: a copy of it gets the TLS settings
			// after that (build/docker, and the image every other test uses,
			// stay as they are).
			last := "-c max_connections=200"
			if s.kind == kindMySQL {
				last = "--max-connections=300"
			}
			script := install + fmt.Sprintf(`sed 's|%[1]s$|%[1]s %[2]s|' /usr/local/bin/locker-serve >/tmp/locker-serve-tls
grep -q -- '%[3]s' /tmp/locker-serve-tls || { echo "locker-serve-tls: no line ends with %[1]s" >&2; exit 3; }
exec sh /tmp/locker-serve-tls "$@"`, last, strings.Join(args, " "), args[len(args)-1])
			sp.entrypoint = []string{"/bin/sh", "-c", script, "locker-serve-tls"}
			// sp.cmd stays: KIND PORT.
		} else {
			sp.entrypoint = []string{"/bin/sh", "-c", install + `exec docker-entrypoint.sh "$@"`, "locker-serve-tls"}
			// The image's entry script runs the server with these
			// arguments (MariaDB's: mariadbd put before its flags).
			sp.cmd = append(sp.cmd, args...)
		}
		switch s.kind {
		case kindPostgres:
			u, err := url.Parse(s.dsn)
			if err != nil {
				return err
			}
			q := u.Query()
			q.Set("sslmode", "verify-full")
			q.Set("sslrootcert", files.CAFile)
			u.RawQuery = q.Encode()
			s.dsn = u.String()
		case kindMySQL:
			name := fmt.Sprintf("locker-test-%d-%d", os.Getpid(), tlsConfigs.Add(1))
			if err := mysql.RegisterTLSConfig(name, files.ClientConfig("127.0.0.1")); err != nil {
				return err
			}
			cfg, err := mysql.ParseDSN(s.dsn)
			if err != nil {
				return err
			}
			cfg.TLSConfig = name
			s.dsn = cfg.FormatDSN()
		}
		return nil
	}
}

// dirList is a list of directories to remove at the end.
type dirList struct {
	mu   sync.Mutex
	dirs []string
}

func (l *dirList) Add(dir string) {
	l.mu.Lock()
	l.dirs = append(l.dirs, dir)
	l.mu.Unlock()
}

func (l *dirList) removeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range l.dirs {
		_ = os.RemoveAll(d)
	}
	l.dirs = nil
}

// GrantOption gives the MariaDB server's user (the DSN's) the GRANT OPTION,
// so that a test can make users with fewer rights (the images give it ALL
// on every database, without it). It runs the mariadb client as root
// inside the container; a server named by LOCKER_TEST_MYSQL_DSN cannot be
// changed so, and the test is skipped.
func (s *Server) GrantOption(t testing.TB) {
	t.Helper()
	if s.kind != kindMySQL {
		t.Fatalf("testserver: GrantOption on %s: only for MySQL servers", s)
	}
	s.control(t, "give GRANT OPTION to the user of")
	e, err := getEngine()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := mysql.ParseDSN(s.DSN())
	if err != nil {
		t.Fatal(err)
	}
	stmt := fmt.Sprintf("GRANT ALL ON *.* TO '%[1]s'@'%%' WITH GRANT OPTION; GRANT ALL ON *.* TO '%[1]s'@'localhost' WITH GRANT OPTION;", cfg.User)
	cmd := []string{"mariadb", "-uroot", "-p" + dbPassword, "-e", stmt}
	if e.profile == profileLocal {
		// The local image's root has no password and logs in on the
		// server's own socket.
		_, port, _ := net.SplitHostPort(s.addr)
		cmd = []string{"mariadb", "-uroot", "--socket=/run/mysqld/mysqld-" + port + ".sock", "-e", stmt}
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	code, out, err := s.ctr.Exec(ctx, cmd, tcexec.Multiplexed())
	if err != nil || code != 0 {
		b, _ := io.ReadAll(out)
		t.Fatalf("testserver: GRANT OPTION on %s: exit %d, %v: %s", s, code, err, strings.TrimSpace(string(b)))
	}
}
