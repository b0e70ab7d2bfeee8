package zookeeper

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/go-locker/locker"
)

// WithTLS makes the sessions the Locker dials (Connect's, and New's with
// WithServers) speak TLS to the servers' secure client port
// (secureClientPort, with the Netty connection factory), verified with cfg:
// its RootCAs (nil: the system's roots), its Certificates (a client
// certificate, for a server with ssl.clientAuth=need) and its ServerName
// (empty: the host of each server address, so a certificate for
// "127.0.0.1" or "zk1.example" verifies against the address you gave).
// A connection that fails its handshake, or that the server refuses after
// it, is tried again as any other; a call that ends waiting for a session
// names the reason (see the package documentation, "TLS and least
// privilege"). New's own connection is yours: dial it with zk.WithDialer.
// URL form: the zookeeper+tls scheme with tls_ca, tls_cert and tls_key.
func WithTLS(cfg *tls.Config) Option {
	return func(c *config) error {
		if cfg == nil {
			return fmt.Errorf("zookeeper: WithTLS: %w: nil *tls.Config", locker.ErrInvalidOption)
		}
		c.tls = cfg.Clone()
		return nil
	}
}

// linkDiag remembers why the latest connection attempt of a link failed
// (the dial, the TLS handshake, a TLS alert from the server after it), until
// a server answers a connect request: go-zookeeper retries connections in
// the background and reports none of these, so a wait for a session that
// ends on its context adds it (see session.awaitSession). The text is the
// net or crypto/tls error: it names the certificate problem, never key
// material or a password.
type linkDiag struct {
	mu   sync.Mutex
	last error
}

func (d *linkDiag) set(err error) {
	d.mu.Lock()
	d.last = err
	d.mu.Unlock()
}

func (d *linkDiag) err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last
}

// dialTLS does the TLS handshake on c, within the handshake bound.
func (k *link) dialTLS(c net.Conn, address string, timeout time.Duration) (net.Conn, error) {
	cfg := k.tls
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			host = address
		}
		cfg = cfg.Clone()
		cfg.ServerName = host
	}
	tc := tls.Client(c, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), min(timeout, k.handshakeLimit()))
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = c.Close()
		if remoteAlert(err) && len(cfg.Certificates) == 0 && cfg.GetClientCertificate == nil {
			// With TLS 1.2 a server that wants a client certificate
			// says only "handshake failure".
			return nil, fmt.Errorf("TLS handshake with %s: %w (the client gave no certificate: a server with ssl.clientAuth=need refuses it; give one with tls_cert and tls_key, or WithTLS)", address, err)
		}
		return nil, fmt.Errorf("TLS handshake with %s: %w", address, err)
	}
	return tc, nil
}

// remoteAlert reports whether err is a TLS alert the server sent (with TLS
// 1.3 a server checks the client's certificate after the handshake: "remote
// error: tls: certificate required").
func remoteAlert(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error"
}

// withLinkErr adds to err, the end of a wait for a session, why the
// latest connection attempt failed, if it did.
func withLinkErr(err error, k *link) error {
	if err == nil || k == nil {
		return err
	}
	if lerr := k.diag.err(); lerr != nil {
		return fmt.Errorf("%w (the latest connection failed: %v)", err, lerr)
	}
	return err
}
