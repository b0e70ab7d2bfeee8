package redlock

import (
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
)

// New's documentation asks for ContextTimeoutEnabled on every node's
// client: without it the node timeout does not reach the socket, and a
// round waits for a stalled node until the client's ReadTimeout. A client
// without it is refused, naming the node, instead of accepted silently.
func TestNewRefusesClientWithoutContextTimeout(t *testing.T) {
	addrs := deadAddrs(t, 3)
	var cs []goredis.UniversalClient
	for i, a := range addrs {
		c := goredis.NewClient(&goredis.Options{Addr: a, ContextTimeoutEnabled: i != 1, DialTimeout: time.Second})
		t.Cleanup(func() { _ = c.Close() })
		cs = append(cs, c)
	}
	l := New(cs)
	t.Cleanup(func() { _ = l.Close() })
	err := l.Err()
	if !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), "ContextTimeoutEnabled") || !strings.Contains(err.Error(), "node 2") {
		t.Fatalf("New with node 2 lacking ContextTimeoutEnabled: Err() = %v; want ErrInvalidOption naming ContextTimeoutEnabled and node 2", err)
	}
	// A Sentinel failover client carries the setting too.
	fo := goredis.NewFailoverClient(&goredis.FailoverOptions{MasterName: "m", SentinelAddrs: addrs[:1]})
	t.Cleanup(func() { _ = fo.Close() })
	l2 := New([]goredis.UniversalClient{cs[0], cs[2], fo})
	t.Cleanup(func() { _ = l2.Close() })
	if err := l2.Err(); err == nil || !strings.Contains(err.Error(), "node 3") {
		t.Fatalf("New with a failover client lacking ContextTimeoutEnabled: Err() = %v; want an error naming node 3", err)
	}
}

// New takes the clients a user has, []*goredis.Client as well as
// []goredis.UniversalClient, without a copy into another slice type.
func TestNewTakesConcreteClients(t *testing.T) {
	var cs []*goredis.Client
	for _, a := range deadAddrs(t, 3) {
		c := goredis.NewClient(&goredis.Options{Addr: a, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		cs = append(cs, c)
	}
	l := New(cs, WithDefaultTTL(5*time.Second))
	t.Cleanup(func() { _ = l.Close() })
	if err := l.Err(); err != nil {
		t.Fatalf("New([]*goredis.Client) = %v", err)
	}
	cs[1] = nil // a typed nil is still found
	l2 := New(cs)
	t.Cleanup(func() { _ = l2.Close() })
	if err := l2.Err(); !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), "node 2: nil client") {
		t.Fatalf("New with a nil *goredis.Client: Err() = %v", err)
	}
}
