package mysql_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	_ "github.com/go-locker/locker/sqltable/mysql"
)

func TestOpenErrors(t *testing.T) {
	const secret = "s3cr3t-pw"
	caFile, notPEM := writeCA(t), filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		url     string
		invalid bool   // wraps ErrInvalidURL
		want    string // in the message
	}{
		{"mysql://u:" + secret + "@h:3306/db?lock_table=", true, `parameter "lock_table" is empty`},
		{"mysql://u:" + secret + "@h:3306/db?bogus=1", true, `unknown parameter(s) bogus`},
		{"mysql://u:" + secret + "@h:3306/", true, `must name one database`},
		{"mysql://u:" + secret + "@h:3306/db?tls=maybe", true, `"maybe" is not true, false`},
		{"mysql://u:" + secret + "@h:3306/db?timeout=x", true, `not a duration`},
		{"mysql://u:" + secret + "@h:3306/db?lock_notify=maybe", true, `not true or false`},
		{"mysql://u:" + secret + "@h:3306/db?lock_tls_ca=", true, `parameter "lock_tls_ca" is empty`},
		{"mysql://u:" + secret + "@h:3306/db?lock_tls_ca=/nonexistent/ca.pem", true, `lock_tls_ca: open /nonexistent/ca.pem`},
		{"mysql://u:" + secret + "@h:3306/db?lock_tls_ca=" + notPEM, true, `no PEM certificate`},
		{"mysql://u:" + secret + "@h:3306/db?tls=false&lock_tls_ca=" + caFile, true, `lock_tls_ca with tls=false`},
		{"mysql://u:" + secret + "@h:3306/db?tls=skip-verify&lock_tls_ca=" + caFile, true, `lock_tls_ca with tls=skip-verify`},
	} {
		l, err := locker.Open(context.Background(), c.url)
		if err == nil {
			l.Close()
			t.Errorf("Open(%q) succeeded", c.url)
			continue
		}
		if c.invalid != errors.Is(err, locker.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v; wraps ErrInvalidURL: %v, want %v", c.url, err, !c.invalid, c.invalid)
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open(%q) = %v, want it to say %q", c.url, err, c.want)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%q) echoes the password: %v", c.url, err)
		}
	}
}

func TestOpenDoesNotConnect(t *testing.T) {
	ca := writeCA(t)
	for _, u := range []string{
		"mysql://u:p@127.0.0.1:1/db?timeout=1s&lock_tls_ca=" + ca,
		"mysql://u:p@127.0.0.1:1/db?timeout=1s&tls=true&lock_tls_ca=" + ca,
		"mysql://u:p@127.0.0.1:1/db?timeout=1s&ttl=5s",
		"mysql://u:p@127.0.0.1:1/db?timeout=1s&lock_notify=false",
		"mysql://u:p@127.0.0.1:1/db?lock_table=temp.locks", // an ordinary schema on MySQL
	} {
		l, err := locker.Open(context.Background(), u)
		if err != nil {
			t.Errorf("Open(%q): %v", u, err)
			continue
		}
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}

// writeCA writes a self-signed CA certificate and returns its file.
func writeCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
