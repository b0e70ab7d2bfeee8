package redlock

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
)

// A malformed node address is named in the error, and the password never
// appears, whatever characters it has ('+', '@' and ';' are written
// escaped or not by url.URL.String, which go-redis' errors quote).
func TestOpenURLBadHostHidesPassword(t *testing.T) {
	for _, pw := range []string{"s3+cr%40t", "s3cr%3Bt%40x", "pa%20ss", "plain+pw"} {
		for _, hosts := range []string{"h1:abc,h2:6379,h3:6379", "h1:6379,h2:99999,h3:6379", "h1:6379,h2:6379,h3:1:2"} {
			u := "redlock://user:" + pw + "@" + hosts
			_, err := Open(context.Background(), u)
			if !errors.Is(err, locker.ErrInvalidURL) || !strings.Contains(err.Error(), "node address \"") {
				t.Errorf("%s: %v, want ErrInvalidURL naming the node address", u, err)
				continue
			}
			for _, secret := range []string{"s3", "cr", "pa", "plain", "redis://"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("%s: error shows %q: %v", u, secret, err)
				}
			}
		}
	}
	// An address given as a parameter that carries userinfo is not echoed.
	_, err := Open(context.Background(), "redlock://h1:6379,h2:6379?addr=u:s3cret@h3:6379")
	if !errors.Is(err, locker.ErrInvalidURL) || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("addr with userinfo: %v", err)
	}
	// Hosts without a port, and IPv6 literals, are fine.
	l, err := Open(context.Background(), "redlock://h1,h2:6379?addr=[::1]:6379")
	if err != nil {
		t.Fatalf("hosts without port / IPv6: %v", err)
	}
	_ = l.Close()
}

// skip_verify would turn TLS verification off on every node: it is refused,
// as the Open documentation says.
func TestOpenURLRefusesSkipVerify(t *testing.T) {
	for _, u := range []string{
		"rediss+redlock://h1:6379,h2:6379,h3:6379?skip_verify=true",
		"redlock://h1:6379,h2:6379,h3:6379?skip_verify=true",
	} {
		l, err := Open(context.Background(), u)
		if err == nil {
			_ = l.Close()
		}
		if !errors.Is(err, locker.ErrInvalidURL) || !strings.Contains(err.Error(), "skip_verify") {
			t.Errorf("%s: %v, want ErrInvalidURL about skip_verify", u, err)
		}
	}
}

// Sentinel failover clients of different masters are different nodes,
// although go-redis gives each the same placeholder Addr.
func TestNewAcceptsSentinelNodes(t *testing.T) {
	var cs []goredis.UniversalClient
	for _, m := range []string{"m1", "m2", "m3"} {
		c := goredis.NewFailoverClient(&goredis.FailoverOptions{MasterName: m, SentinelAddrs: deadAddrs(t, 1), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		cs = append(cs, c)
	}
	l := New(cs)
	defer l.Close()
	if err := l.Err(); err != nil {
		t.Fatalf("three failover clients: %v", err)
	}
}

// A typed nil client is a clear error, not a panic.
func TestNewTypedNilClient(t *testing.T) {
	cs := clientsFor(t, deadAddrs(t, 2))
	for _, nc := range []goredis.UniversalClient{(*goredis.Client)(nil), (*goredis.ClusterClient)(nil), (*goredis.Ring)(nil)} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("%T(nil): panic %v", nc, r)
				}
			}()
			l := New([]goredis.UniversalClient{cs[0], nc, cs[1]})
			defer l.Close()
			if err := l.Err(); !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), "node 2: nil client") {
				t.Fatalf("%T(nil): Err() = %v", nc, err)
			}
		}()
	}
}

// A node's own timeout (a context error of the request's context, or of
// go-redis inside it) is not the caller's: errors.Is(err,
// context.DeadlineExceeded) holds only when the caller's context ended.
func TestNodeTimeoutIsNotCallerDeadline(t *testing.T) {
	l := New(clientsFor(t, deadAddrs(t, 3)))
	defer l.Close()
	for _, cerr := range []error{context.DeadlineExceeded, context.Canceled} {
		out, err := fanout(l, context.Background(), context.Background(), nil, l.all, 50*time.Millisecond,
			func(ctx context.Context, _ int, c goredis.UniversalClient) (bool, error) {
				return false, cerr
			}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range l.all {
			if errors.Is(out.err[i], context.DeadlineExceeded) || errors.Is(out.err[i], context.Canceled) {
				t.Errorf("node %d: %v looks like the caller's context error", i+1, out.err[i])
			}
			if !strings.Contains(out.err[i].Error(), "no answer within the node timeout") {
				t.Errorf("node %d: %v", i+1, out.err[i])
			}
		}
	}
	// When the caller's context ended, its error stays recognisable.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out, _ := fanout(l, context.Background(), ctx, nil, l.all[:1], 50*time.Millisecond,
		func(ctx context.Context, _ int, c goredis.UniversalClient) (bool, error) {
			return false, ctx.Err()
		}, nil, nil)
	if !errors.Is(out.err[0], context.Canceled) {
		t.Errorf("caller's cancelled context: %v", out.err[0])
	}
	// End to end, over nodes that refuse connections.
	ol, err := Open(context.Background(), "redlock://"+strings.Join(deadAddrs(t, 3), ",")+"?ttl=1s")
	if err != nil {
		t.Fatal(err)
	}
	defer ol.Close()
	for range 5 {
		_, err := ol.TryAcquire(context.Background(), "k")
		if !errors.Is(err, ErrNoQuorum) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			t.Fatalf("TryAcquire with a live context: %v", err)
		}
	}
}

// silentNodes returns n loopback addresses that accept connections, read
// them and never answer, and a function that reports how many connections
// each has accepted.
func silentNodes(t *testing.T, n int) ([]string, func() []int) {
	t.Helper()
	var (
		mu     sync.Mutex
		counts = make([]int, n)
		addrs  []string
	)
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var conns []net.Conn
		t.Cleanup(func() {
			_ = ln.Close()
			mu.Lock()
			defer mu.Unlock()
			for _, c := range conns {
				_ = c.Close()
			}
		})
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				counts[i]++
				conns = append(conns, c)
				mu.Unlock()
				go func() {
					buf := make([]byte, 4096)
					for {
						if _, err := c.Read(buf); err != nil {
							return
						}
					}
				}()
			}
		}()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs, func() []int {
		mu.Lock()
		defer mu.Unlock()
		return append([]int(nil), counts...)
	}
}

// Close with an Acquire waiting on nodes that accept connections and never
// answer returns within closeGrace (plus scheduling), although the Pub/Sub
// connections are stuck in their handshake: go-redis' PubSub.Close waits
// for that handshake, which lasts until the client's ReadTimeout (3s).
func TestCloseWithSilentNodes(t *testing.T) {
	for _, own := range []bool{true, false} {
		name := map[bool]string{true: "Open", false: "New"}[own]
		t.Run(name, func(t *testing.T) {
			addrs, accepted := silentNodes(t, 3)
			var l *Locker
			if own {
				var err error
				l, err = Open(context.Background(), "redlock://"+strings.Join(addrs, ",")+"?ttl=1s")
				if err != nil {
					t.Fatal(err)
				}
			} else {
				var cs []goredis.UniversalClient
				for _, a := range addrs {
					c := goredis.NewClient(&goredis.Options{Addr: a, ContextTimeoutEnabled: true})
					t.Cleanup(func() { _ = c.Close() })
					cs = append(cs, c)
				}
				l = New(cs, WithDefaultTTL(time.Second))
			}
			done := make(chan error, 1)
			go func() {
				_, err := l.Acquire(context.Background(), "k")
				done <- err
			}()
			// Wait until the Acquire waits (its Pub/Sub connections are
			// being made), then for a connection to every node made since.
			waitFor(t, func() bool {
				l.subs.mu.Lock()
				defer l.subs.mu.Unlock()
				return l.subs.nodes != nil
			})
			before := accepted()
			waitFor(t, func() bool {
				now := accepted()
				for i := range now {
					if now[i] <= before[i] {
						return false
					}
				}
				return true
			})
			start := time.Now()
			if err := l.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("Close took %v with silent nodes, want about %v", d, closeGrace)
			}
			select {
			case err := <-done:
				if !errors.Is(err, locker.ErrClosed) {
					t.Errorf("Acquire after Close: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Acquire still blocked 5s after Close")
			}
		})
	}
}

// waitFor polls cond (a state change with no signal of its own) until it
// holds, or fails the test after 10s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// A round that lost with nodes unreachable says so, and is not retried as
// a split between contenders when the one other owner it saw may hold a
// majority with the nodes that did not answer.
func TestRoundResultUnreachable(t *testing.T) {
	for _, tc := range []struct {
		r        roundResult
		split    bool
		contain  string
		notSplit bool
	}{
		// 3 nodes: one held by X, one failed: X may hold a majority.
		{r: roundResult{n: 3, quorum: 2, granted: 1, denied: 1, failed: 1, maxHolder: 1}, contain: "unreachable"},
		// 5 nodes: X on 1, 2 failed, 2 granted: X may hold 3.
		{r: roundResult{n: 5, quorum: 3, granted: 2, denied: 1, failed: 2, maxHolder: 1}, contain: "unreachable"},
		// 5 nodes: X and Y on one each, 1 failed: nobody can have 3.
		{r: roundResult{n: 5, quorum: 3, granted: 2, denied: 2, failed: 1, maxHolder: 1}, split: true, contain: "unreachable"},
		// no failures: a split.
		{r: roundResult{n: 3, quorum: 2, granted: 1, denied: 2, maxHolder: 1}, split: true, contain: "contenders split"},
		// a majority failed.
		{r: roundResult{n: 3, quorum: 2, denied: 1, failed: 2, maxHolder: 1}, contain: "too few nodes answered"},
	} {
		if got := tc.r.split(); got != tc.split {
			t.Errorf("%+v: split() = %v, want %v", tc.r, got, tc.split)
		}
		msg := tc.r.err().Error()
		if !strings.Contains(msg, tc.contain) {
			t.Errorf("%+v: %q lacks %q", tc.r, msg, tc.contain)
		}
		if tc.r.failed > 0 && strings.Contains(msg, "contenders split") {
			t.Errorf("%+v: %q blames contenders while nodes failed", tc.r, msg)
		}
	}
}

// agreed takes the value a majority has, else the largest.
func TestAgreed(t *testing.T) {
	for _, c := range []struct {
		vals   []int64
		quorum int
		v      int64
		n      int
	}{
		{nil, 2, 0, 0},
		{[]int64{7, 7, 8}, 2, 7, 2},
		{[]int64{8, 7, 7}, 2, 7, 2},
		{[]int64{7, 8, 9}, 2, 9, 1},
		{[]int64{7, 8}, 2, 8, 1},
		{[]int64{5, 5}, 2, 5, 2},
		{[]int64{3, 9, 3, 9, 3}, 3, 3, 3},
		{[]int64{3, 9, 4, 9, 5}, 3, 9, 2},
	} {
		if v, n := agreed(c.vals, c.quorum); v != c.v || n != c.n {
			t.Errorf("agreed(%v, %d) = %d, %d; want %d, %d", c.vals, c.quorum, v, n, c.v, c.n)
		}
	}
}

// A round whose outcome is decided while the rest of its answers are on
// their way (fanoutSettle) keeps that outcome when its caller's context
// ends while it waits for them: the end only ends the waiting, and the
// answers that came are the round's.
func TestSettlingOutcomeStandsWhenWaitEnds(t *testing.T) {
	l := New(clientsFor(t, deadAddrs(t, 3)))
	defer l.Close()
	wait, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	defer close(release)
	out, err := fanoutSettle(l, wait, context.Background(), nil, l.all, time.Minute,
		func(ctx context.Context, i int, c goredis.UniversalClient) (bool, error) {
			if i == 2 {
				<-release // the last node answers after the test
				return false, nil
			}
			return false, nil
		}, nil, func(o outcome[bool]) bool {
			if o.answered[0] && o.answered[1] {
				cancel() // the caller gives up while the round settles
				return true
			}
			return false
		}, true)
	if err != nil {
		t.Fatalf("fanoutSettle: %v, want the decided outcome", err)
	}
	if !out.answered[0] || !out.answered[1] || out.answered[2] {
		t.Fatalf("answered %v, want the first two nodes", out.answered)
	}
}
