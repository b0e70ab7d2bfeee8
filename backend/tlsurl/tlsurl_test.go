package tlsurl

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

func TestConfig(t *testing.T) {
	dir := t.TempDir()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	secret := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}))
	files := map[string]string{
		"ca.pem":   string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		"cert.pem": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		"key.pem":  secret,
		"junk.pem": "not pem",
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f := func(name string) string { return url.QueryEscape(filepath.Join(dir, name)) }
	parse := func(raw string, tlsScheme bool) error {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		q, err := backend.ParseQuery(u)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := Config(q, tlsScheme, "xs://")
		if err == nil {
			err = q.Finish()
		}
		if err == nil && tlsScheme && cfg == nil {
			t.Fatalf("%s: no configuration", raw)
		}
		return err
	}
	for _, ok := range []string{
		"xs://h",
		"xs://h?tls_ca=" + f("ca.pem"),
		"xs://h?tls_cert=" + f("cert.pem") + "&tls_key=" + f("key.pem"),
	} {
		if err := parse(ok, true); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	if err := parse("x://h", false); err != nil {
		t.Errorf("plain, no parameters: %v", err)
	}
	for _, c := range []struct {
		raw  string
		tls  bool
		want string
	}{
		{"x://h?tls_ca=" + f("ca.pem"), false, "use xs://"},
		{"xs://h?tls_cert=" + f("cert.pem"), true, "go together"},
		{"xs://h?tls_key=" + f("key.pem"), true, "go together"},
		{"xs://h?tls_ca=" + f("junk.pem"), true, "no PEM certificate"},
		{"xs://h?tls_ca=" + f("missing.pem"), true, "no such file"},
		{"xs://h?tls_cert=" + f("key.pem") + "&tls_key=" + f("cert.pem"), true, "tls_cert and tls_key"},
	} {
		err := parse(c.raw, c.tls)
		if !errors.Is(err, locker.ErrInvalidURL) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error wrapping ErrInvalidURL saying %q", c.raw, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), "PRIVATE KEY") || strings.Contains(err.Error(), secret[40:80]) {
			t.Errorf("%s: the error shows the key: %v", c.raw, err)
		}
	}
}
