package zookeeper

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// MinDriftMargin is the least margin the Locker keeps between declaring a
// disconnected lock lost and the earliest moment the server could expire
// the session; see WithDriftMargin.
const MinDriftMargin = 50 * time.Millisecond

// Option configures a Locker made by Connect or New. WithDefaultTTL,
// WithDriftMargin, WithPrefix, WithTokenBase and WithLogger are the names
// every backend gives these settings (see backend.Settings); the others are this
// package's own.
type Option func(*config) error

// config is the shared settings (backend.Settings: the default TTL, the
// drift margin, 0 for sessionTimeout/10 at least MinDriftMargin, the
// prefix, which is the root node, and the logger) and this package's own.
type config struct {
	backend.Settings
	sessionTimeout time.Duration // New: declared (WithSessionTimeout)
	servers        []string      // New: where to dial sessions (WithServers)
	acl            []zk.ACL
	tls            *tls.Config // WithTLS
	auth           []authInfo
	logger         zk.Logger // Settings.Logger for go-zookeeper; none by default
	containers     bool
	err            error
}

type authInfo struct {
	scheme string
	auth   []byte
}

func (c *config) fail(err error) {
	if c.err == nil {
		c.err = err
	}
}

func newConfig(opts []Option) config {
	c := config{Settings: backend.Settings{Prefix: DefaultRoot}, acl: zk.WorldACL(zk.PermAll), logger: quietLogger{}, containers: true}
	c.fail(backend.Apply(&c, opts))
	if c.DriftMargin > 0 && c.sessionTimeout > 0 && c.DriftMargin >= c.sessionTimeout/2 {
		c.fail(fmt.Errorf("zookeeper: WithDriftMargin: %w: %v is not below half the session timeout %v of your connection (every short disconnect would lose every lock)", locker.ErrInvalidOption, c.DriftMargin, c.sessionTimeout))
	}
	if c.Logger != nil {
		c.logger = slogPrinter{c.Logger}
	}
	return c
}

// driftMargin is how long before the earliest possible server-side expiry
// of a silent session the Locker gives its locks up. A margin set with
// WithDriftMargin is kept at most half the session's timeout: a short
// lease's session (a TTL of a second) keeps half of it.
func (c *config) driftMargin(timeout time.Duration) time.Duration {
	if c.DriftMargin > 0 {
		return min(c.DriftMargin, timeout/2)
	}
	return max(timeout/10, MinDriftMargin)
}

// WithPrefix sets the root: the parent node of the lock directories
// (default DefaultRoot, "/locker"; in a URL its path, or the parameter
// prefix). Every Locker that locks the same keys must use the same root.
// It is created, as container nodes, when missing.
func WithPrefix(root string) Option {
	return func(c *config) error {
		if err := checkRoot(root); err != nil {
			return fmt.Errorf("zookeeper: WithPrefix: %w", err)
		}
		c.Prefix = root
		return nil
	}
}

// WithDefaultTTL sets the TTL of locks taken without a per-call
// locker.WithTTL (URL parameter ttl; default locker.DefaultTTL). It must
// lie in the portable range [locker.MinTTL, locker.MaxTTL]. With Connect
// it is also the timeout of the Locker's primary session, the one Connect
// waits for.
func WithDefaultTTL(ttl time.Duration) Option {
	return func(c *config) error {
		if err := backend.SetDefaultTTL(ttl)(&c.Settings); err != nil {
			return fmt.Errorf("zookeeper: %w", err)
		}
		return nil
	}
}

// WithSessionTimeout is for New: the session timeout you gave zk.Connect
// for the connection you pass (go-zookeeper does not tell what the server
// granted). It is required there, at least a second, and checked against
// what the server grants for it (see New). Connect refuses it: its
// sessions' timeouts are the TTLs of its locks (WithDefaultTTL,
// locker.WithTTL), and the session_timeout URL parameter is gone with it.
func WithSessionTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Second {
			return fmt.Errorf("zookeeper: WithSessionTimeout: %w: %v is below a second", locker.ErrInvalidOption, d)
		}
		c.sessionTimeout = d
		return nil
	}
}

// WithServers is for New: the ensemble ("host:port"; the port defaults to
// 2181) where New dials sessions of its own for the locks whose lease
// differs from your connection's session timeout, as Connect does for
// every lease (with WithAuth's credentials). Without it New has your
// session only: a lock with a TTL at or above its timeout gets that
// timeout as its lease (shorter, and reported by Handle.TTL), and a
// shorter TTL is refused with an error wrapping locker.ErrInvalidOption.
// Connect refuses it (it takes the servers as its argument).
func WithServers(servers ...string) Option {
	return func(c *config) error {
		if len(servers) == 0 {
			return fmt.Errorf("zookeeper: WithServers: %w: no servers", locker.ErrInvalidOption)
		}
		addrs, err := checkServers(servers)
		if err != nil {
			return fmt.Errorf("zookeeper: WithServers: %w", err)
		}
		c.servers = addrs
		return nil
	}
}

// WithACL sets the ACL of the lock nodes and of the directories the Locker
// creates (default: zk.WorldACL(zk.PermAll)). With a digest ACL such as
// zk.DigestACL(zk.PermAll, user, password), together with WithAuth for the
// same identity, clients of other identities can neither take nor delete
// the locks. Every Locker that locks the same keys needs the permissions
// the ACL grants.
func WithACL(acl ...zk.ACL) Option {
	return func(c *config) error {
		if len(acl) == 0 {
			return fmt.Errorf("zookeeper: WithACL: %w: empty ACL", locker.ErrInvalidOption)
		}
		c.acl = append([]zk.ACL(nil), acl...)
		return nil
	}
}

// WithAuth adds authentication to every session the Locker dials, as
// zk.Conn.AddAuth does (for example scheme "digest" and "user:password"),
// before the session takes a lock; go-zookeeper sends it again after every
// reconnect. On New's own connection it is not added: add auth to your
// connection yourself.
func WithAuth(scheme string, auth []byte) Option {
	return func(c *config) error {
		if scheme == "" {
			return fmt.Errorf("zookeeper: WithAuth: %w: empty scheme", locker.ErrInvalidOption)
		}
		c.auth = append(c.auth, authInfo{scheme, append([]byte(nil), auth...)})
		return nil
	}
}

// WithDriftMargin sets how long before the earliest moment the server could
// expire a disconnected session the Locker reports its locks lost (default:
// a tenth of the session's timeout, at least MinDriftMargin). It covers
// clock rate differences and the time a ping takes to reach the server. It
// must be at least MinDriftMargin (and, with New, below half your
// connection's session timeout); a session whose timeout is shorter than
// twice the margin keeps half its timeout instead. Through a follower the
// lease is counted from a sync the leader surely saw, some third of a
// timeout before the latest answer (see the package doc, Failure modes):
// a margin above a quarter of the timeout there gives locks up after
// short silences. URL parameter drift_margin.
func WithDriftMargin(d time.Duration) Option {
	return func(c *config) error {
		if d < MinDriftMargin {
			return fmt.Errorf("zookeeper: WithDriftMargin: %w: %v is below %v", locker.ErrInvalidOption, d, MinDriftMargin)
		}
		c.DriftMargin = d
		return nil
	}
}

// WithTokenBase adds n to every token the Locker hands out (URL parameter
// token_base): Handle.Token and LockInfo.Token are n plus the holder node's
// czxid. n must be within [0, locker.MaxTokenBase]; give every Locker of a
// deployment the same n, as the same root (see locker.MaxTokenBase, and
// README's "Changing backends" for when to set it).
func WithTokenBase(n int64) Option {
	return func(c *config) error {
		if err := backend.SetTokenBase(n)(&c.Settings); err != nil {
			return fmt.Errorf("zookeeper: %w", err)
		}
		return nil
	}
}

// WithLogger sets where the Locker logs its events (no URL form): session
// established, disconnected (its locks at risk), reconnected (cleared),
// expired, a lock lost and why; and the logger of the connections the
// Locker dials (go-zookeeper's own messages, at level Info; go-zookeeper
// otherwise logs every reconnect through the log package). Nil, the
// default, logs nothing. Keys are shown as errors show them; passwords
// never.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { return backend.SetLogger(l)(&c.Settings) }
}

// slogPrinter is a zk.Logger over a *slog.Logger.
type slogPrinter struct{ l *slog.Logger }

func (p slogPrinter) Printf(format string, args ...any) {
	p.l.Info(fmt.Sprintf(format, args...), "backend", "zookeeper")
}

// WithoutContainers makes the Locker create its root and lock directories
// as persistent nodes instead of container nodes, for servers older than
// ZooKeeper 3.5.3. Empty lock directories then stay until someone deletes
// them (safe at any time: the Locker recreates a directory it needs). The
// Locker also falls back to persistent nodes by itself when the server
// answers CreateContainer with "unimplemented".
func WithoutContainers() Option {
	return func(c *config) error {
		c.containers = false
		return nil
	}
}

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}
