// Package tlsurl reads the TLS client parameters of a backend URL, the same
// on every backend that takes them (etcds://, zookeeper+tls://). It is a
// package of its own so that a backend without TLS parameters, and the
// locker command's SQLite-only binary, do not link crypto/tls.
package tlsurl

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// URL parameters of a TLS client, the same on every backend that takes
// them (etcds://, zookeeper+tls://): PEM files on the client's machine.
const (
	ParamCA   = "tls_ca"   // the CAs that verify the server, instead of the system's roots
	ParamCert = "tls_cert" // the client certificate (chain), with tls_key
	ParamKey  = "tls_key"  // the client certificate's private key, with tls_cert
)

// Config reads tls_ca, tls_cert and tls_key from q and returns the
// client configuration they describe, on top of MinVersion TLS 1.2 and
// verification of the server against the system's roots (or tls_ca).
// Without tls it refuses them: TLS parameters on a plain scheme would be
// ignored silently. Errors wrap locker.ErrInvalidURL, name the parameter
// and the file, and show nothing of a file's content.
func Config(q *backend.Query, tlsScheme bool, plainHint string) (*tls.Config, error) {
	bad := func(format string, args ...any) (*tls.Config, error) {
		return nil, fmt.Errorf("%w: %s: "+format, append([]any{locker.ErrInvalidURL, q.Scheme()}, args...)...)
	}
	ca, hasCA := q.Take(ParamCA)
	cert, hasCert := q.Take(ParamCert)
	key, hasKey := q.Take(ParamKey)
	if !tlsScheme {
		if hasCA || hasCert || hasKey {
			return bad("parameters %s, %s and %s are for TLS: use %s", ParamCA, ParamCert, ParamKey, plainHint)
		}
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if hasCA {
		b, err := os.ReadFile(ca)
		if err != nil {
			return bad("parameter %s: %v", ParamCA, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return bad("parameter %s: no PEM certificate in %s", ParamCA, ca)
		}
		cfg.RootCAs = pool
	}
	switch {
	case hasCert != hasKey:
		return bad("parameters %s and %s go together: give both (the client certificate and its private key)", ParamCert, ParamKey)
	case hasCert:
		kp, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			// crypto/tls names what is wrong, never the key material.
			return bad("parameters %s and %s (%s, %s): %v", ParamCert, ParamKey, cert, key, err)
		}
		cfg.Certificates = []tls.Certificate{kp}
	}
	return cfg, nil
}
