package etcd

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"

	"google.golang.org/grpc/credentials"
)

// connDiag remembers why the latest TLS connection of a client Open made
// failed: gRPC retries a connection in the background and etcd's client
// waits for one until a call's context ends, so without it a server
// certificate of another CA, or a server refusing the client's
// certificate, shows only as "context deadline exceeded". A call that ends
// on its context adds the reason (see Locker.connErr); a connection that
// works clears it. The reason is crypto/tls's error text: it names the
// certificate problem, never key material or a password.
type connDiag struct {
	mu   sync.Mutex
	last error
}

func (d *connDiag) set(err error) {
	d.mu.Lock()
	d.last = err
	d.mu.Unlock()
}

// err returns the reason the latest connection failed, or nil.
func (d *connDiag) err() error {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last
}

// diagCreds are gRPC's TLS credentials for cfg, recording into d.
type diagCreds struct {
	credentials.TransportCredentials
	d *connDiag
}

func newDiagCreds(cfg *tls.Config, d *connDiag) credentials.TransportCredentials {
	if len(cfg.Certificates) == 0 && cfg.GetClientCertificate == nil {
		// A server that requests a client certificate this client does
		// not have: recorded at the request, during the handshake. A
		// server that requires one then refuses the connection with an
		// alert ("certificate required", which replaces this record when
		// it arrives), but it may close the connection before the client
		// reads the alert (a reset discards it), and then nothing else
		// would say why.
		cfg = cfg.Clone()
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			d.set(errNoClientCert)
			return &tls.Certificate{}, nil // send none, as crypto/tls does without one
		}
	}
	return &diagCreds{TransportCredentials: credentials.NewTLS(cfg), d: d}
}

// errNoClientCert is the record of a server that requested a client
// certificate from a client that has none.
var errNoClientCert = errors.New("the server requested a client certificate and none is configured (tls_cert and tls_key); a server that requires one refuses the connection (tls: certificate required)")

func (c *diagCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		if ctx.Err() == nil {
			c.d.set(err)
		}
		return nil, nil, err
	}
	return &diagConn{Conn: conn, d: c.d}, info, nil
}

func (c *diagCreds) Clone() credentials.TransportCredentials {
	return &diagCreds{TransportCredentials: c.TransportCredentials.Clone(), d: c.d}
}

// diagConn records a TLS alert the server sends after the handshake (with
// TLS 1.3 the server checks the client's certificate then: "remote error:
// tls: certificate required"), and clears the record once the server has
// sent data.
type diagConn struct {
	net.Conn
	d    *connDiag
	once sync.Once
}

func (c *diagConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	var op *net.OpError
	switch {
	case n > 0:
		c.once.Do(func() { c.d.set(nil) })
	case err != nil && errors.As(err, &op) && op.Op == "remote error":
		c.d.set(err)
	}
	return n, err
}
