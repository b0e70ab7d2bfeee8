package testserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority made by a test, for servers that speak TLS:
// it issues a server certificate for 127.0.0.1 and localhost, and client
// certificates. Its keys live in memory only; certificates are valid for a
// day around now.
type CA struct {
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	pem    []byte
	serial atomic.Int64
}

// Cert is a certificate the CA issued, with its private key, in PEM.
type Cert struct {
	CertPEM []byte // the certificate, then the CA's
	KeyPEM  []byte // PKCS#8 "PRIVATE KEY"
}

// NewCA makes a CA named name (its subject's common name).
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testserver: CA key: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-12 * time.Hour), NotAfter: time.Now().Add(12 * time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testserver: CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testserver: CA certificate: %v", err)
	}
	ca := &CA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	ca.serial.Store(1)
	return ca
}

// PEM returns the CA's certificate in PEM.
func (ca *CA) PEM() []byte { return ca.pem }

// Pool returns a pool holding the CA's certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// ServerCert issues a certificate for a server at 127.0.0.1 and localhost
// (it also serves as a client certificate, as etcd's does for its own
// gateway connections).
func (ca *CA) ServerCert(t testing.TB) Cert {
	t.Helper()
	return ca.issue(t, "127.0.0.1", []net.IP{net.IPv4(127, 0, 0, 1)}, []string{"localhost"},
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth})
}

// ClientCert issues a client certificate whose common name is cn.
func (ca *CA) ClientCert(t testing.TB, cn string) Cert {
	t.Helper()
	return ca.issue(t, cn, nil, nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth})
}

func (ca *CA) issue(t testing.TB, cn string, ips []net.IP, dns []string, usage []x509.ExtKeyUsage) Cert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testserver: key for %s: %v", cn, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial.Add(1)), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-12 * time.Hour), NotAfter: time.Now().Add(12 * time.Hour),
		IPAddresses: ips, DNSNames: dns,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("testserver: certificate for %s: %v", cn, err)
	}
	k, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("testserver: key for %s: %v", cn, err)
	}
	certPEM := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), ca.pem...)
	return Cert{CertPEM: certPEM, KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: k})}
}

// TLS returns the certificate for a tls.Config.
func (c Cert) TLS(t testing.TB) tls.Certificate {
	t.Helper()
	kp, err := tls.X509KeyPair(c.CertPEM, c.KeyPEM)
	if err != nil {
		t.Fatalf("testserver: key pair: %v", err)
	}
	return kp
}

// ClientTLS returns a client configuration that trusts ca and presents
// cert (none when cert is the zero Cert), for a server at 127.0.0.1.
func (ca *CA) ClientTLS(t testing.TB, cert Cert) *tls.Config {
	t.Helper()
	cfg := &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	if cert.CertPEM != nil {
		cfg.Certificates = []tls.Certificate{cert.TLS(t)}
	}
	return cfg
}

// ClientTLSFromDir is the client TLS configuration of a directory written
// for a server and its clients (ca.pem, client.pem, client.key: the files
// the etcd and ZooKeeper TLS tests give their servers): the CA to trust and
// the client certificate to present.
func ClientTLSFromDir(t testing.TB, dir string) *tls.Config {
	t.Helper()
	ca, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatal("no CA certificate in ca.pem")
	}
	kp, err := tls.LoadX509KeyPair(filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.key"))
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{kp}, MinVersion: tls.VersionTLS12}
}
