package zookeeper

import (
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
)

// DefaultSessionTimeout is the session timeout Connect asks for unless
// WithSessionTimeout says otherwise. The server grants a value between its
// minSessionTimeout and maxSessionTimeout (by default 2 and 20 ticks).
const DefaultSessionTimeout = 10 * time.Second

// MinDriftMargin is the least margin the Locker keeps between declaring a
// disconnected lock lost and the earliest moment the server could expire
// the session; see WithDriftMargin.
const MinDriftMargin = 50 * time.Millisecond

// Option configures a Locker made by Connect or New.
type Option func(*config)

type config struct {
	root           string
	sessionTimeout time.Duration // requested (Connect) or declared (New)
	acl            []zk.ACL
	auth           []authInfo
	drift          time.Duration // 0: sessionTimeout/10, at least MinDriftMargin
	logger         zk.Logger
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
	c := config{root: DefaultRoot, acl: zk.WorldACL(zk.PermAll), logger: quietLogger{}, containers: true}
	for _, opt := range opts {
		if opt != nil {
			opt(&c)
		}
	}
	if c.drift > 0 && c.sessionTimeout > 0 && c.drift >= c.sessionTimeout/2 {
		c.fail(fmt.Errorf("zookeeper: WithDriftMargin: %w: %v is not below half the session timeout %v (every short disconnect would lose every lock)", locker.ErrInvalidOption, c.drift, c.sessionTimeout))
	}
	return c
}

// driftMargin is how long before the earliest possible server-side expiry
// of a silent session the Locker gives its locks up.
// A margin set with WithDriftMargin is kept below half the timeout the
// server granted, should it have granted less than was asked.
func (c *config) driftMargin(timeout time.Duration) time.Duration {
	if c.drift > 0 {
		return min(c.drift, timeout/2)
	}
	return max(timeout/10, MinDriftMargin)
}

// WithRoot sets the parent node of the lock directories (default
// DefaultRoot, "/locker"). Every Locker that locks the same keys must use
// the same root. It is created, as container nodes, when missing.
func WithRoot(root string) Option {
	return func(c *config) {
		if err := checkRoot(root); err != nil {
			c.fail(fmt.Errorf("zookeeper: WithRoot: %w", err))
			return
		}
		c.root = root
	}
}

// WithSessionTimeout sets the session timeout. With Connect it is the
// timeout asked of the server, which may grant another (the Locker uses the
// granted one). With New it must be the timeout the caller gave zk.Connect,
// and the server's maxSessionTimeout must not be lower (go-zookeeper does
// not tell the Locker the granted value; a server that grants less would
// let the Locker report a disconnected lock lost too late). It must be at
// least a second.
func WithSessionTimeout(d time.Duration) Option {
	return func(c *config) {
		if d < time.Second {
			c.fail(fmt.Errorf("zookeeper: WithSessionTimeout: %w: %v is below a second", locker.ErrInvalidOption, d))
			return
		}
		c.sessionTimeout = d
	}
}

// WithACL sets the ACL of the lock nodes and of the directories the Locker
// creates (default: zk.WorldACL(zk.PermAll)). With a digest ACL such as
// zk.DigestACL(zk.PermAll, user, password), together with WithAuth for the
// same identity, clients of other identities can neither take nor delete
// the locks. Every Locker that locks the same keys needs the permissions
// the ACL grants.
func WithACL(acl ...zk.ACL) Option {
	return func(c *config) {
		if len(acl) == 0 {
			c.fail(fmt.Errorf("zookeeper: WithACL: %w: empty ACL", locker.ErrInvalidOption))
			return
		}
		c.acl = append([]zk.ACL(nil), acl...)
	}
}

// WithAuth adds authentication to a connection Connect makes, as
// zk.Conn.AddAuth does (for example scheme "digest" and "user:password").
// go-zookeeper sends it again after every reconnect. New ignores it: add
// auth to your own connection.
func WithAuth(scheme string, auth []byte) Option {
	return func(c *config) {
		if scheme == "" {
			c.fail(fmt.Errorf("zookeeper: WithAuth: %w: empty scheme", locker.ErrInvalidOption))
			return
		}
		c.auth = append(c.auth, authInfo{scheme, append([]byte(nil), auth...)})
	}
}

// WithDriftMargin sets how long before the earliest moment the server could
// expire a disconnected session the Locker reports its locks lost (default:
// a tenth of the session timeout, at least MinDriftMargin). It covers clock
// rate differences and the time a ping takes to reach the server. It must
// be at least MinDriftMargin and below half the session timeout.
func WithDriftMargin(d time.Duration) Option {
	return func(c *config) {
		if d < MinDriftMargin {
			c.fail(fmt.Errorf("zookeeper: WithDriftMargin: %w: %v is below %v", locker.ErrInvalidOption, d, MinDriftMargin))
			return
		}
		c.drift = d
	}
}

// WithLogger sets the logger of a connection Connect makes (default: none;
// go-zookeeper otherwise logs every reconnect through the log package).
func WithLogger(l zk.Logger) Option {
	return func(c *config) {
		if l == nil {
			l = quietLogger{}
		}
		c.logger = l
	}
}

// WithoutContainers makes the Locker create its root and lock directories
// as persistent nodes instead of container nodes, for servers older than
// ZooKeeper 3.5.3. Empty lock directories then stay until someone deletes
// them (safe at any time: the Locker recreates a directory it needs). The
// Locker also falls back to persistent nodes by itself when the server
// answers CreateContainer with "unimplemented".
func WithoutContainers() Option {
	return func(c *config) { c.containers = false }
}

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}
