package redlock

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
)

// deadAddrs returns n loopback addresses on which nothing listens: a
// connection there is refused at once.
func deadAddrs(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ln.Addr().String())
		_ = ln.Close()
	}
	return out
}

func clientsFor(t *testing.T, addrs []string) []goredis.UniversalClient {
	t.Helper()
	var cs []goredis.UniversalClient
	for _, a := range addrs {
		c := goredis.NewClient(&goredis.Options{Addr: a, ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: time.Second, DialerRetries: 1})
		t.Cleanup(func() { _ = c.Close() })
		cs = append(cs, c)
	}
	return cs
}

func TestNewRejectsBadNodeSets(t *testing.T) {
	addrs := deadAddrs(t, 5)
	one := clientsFor(t, addrs[:1])
	three := clientsFor(t, addrs[:3])
	cluster := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs[:1]})
	t.Cleanup(func() { _ = cluster.Close() })
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": addrs[0]}})
	t.Cleanup(func() { _ = ring.Close() })
	dup := clientsFor(t, []string{addrs[0], addrs[1], addrs[0]})
	for _, tc := range []struct {
		name    string
		clients []goredis.UniversalClient
		want    string
	}{
		{"none", nil, "got 0"},
		{"one", one, "got 1"},
		{"two", append(one, three[1]), "got 2"},
		{"four", append(clientsFor(t, addrs[:3]), clientsFor(t, addrs[3:4])...), "got 4"},
		{"cluster", []goredis.UniversalClient{three[0], three[1], cluster}, "ClusterClient"},
		{"ring", []goredis.UniversalClient{ring, three[1], three[2]}, "Ring"},
		{"nil", []goredis.UniversalClient{three[0], nil, three[2]}, "nil client"},
		{"duplicate", dup, "same server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := New(tc.clients)
			defer l.Close()
			err := l.Err()
			if !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Err() = %v, want ErrInvalidOption mentioning %q", err, tc.want)
			}
			_, aerr := l.TryAcquire(context.Background(), "k")
			if !errors.Is(aerr, locker.ErrInvalidOption) {
				t.Fatalf("TryAcquire = %v, want ErrInvalidOption", aerr)
			}
		})
	}
	l := New(three)
	defer l.Close()
	if err := l.Err(); err != nil {
		t.Fatalf("three distinct nodes: Err() = %v", err)
	}
	if n, q := l.Nodes(); n != 3 || q != 2 {
		t.Fatalf("Nodes() = %d, %d; want 3, 2", n, q)
	}
}

func TestOptions(t *testing.T) {
	three := clientsFor(t, deadAddrs(t, 3))
	for _, tc := range []struct {
		name string
		opts []Option
		want string
	}{
		{"ttl below min", []Option{WithDefaultTTL(100 * time.Millisecond)}, "outside the portable range [1s, 24h0m0s]"},
		{"ttl above max", []Option{WithDefaultTTL(locker.MaxTTL + 1)}, "outside the portable range"},
		{"drift zero", []Option{WithDriftMargin(0)}, "WithDriftMargin: must be positive"},
		{"drift half ttl", []Option{WithDefaultTTL(time.Second), WithDriftMargin(500 * time.Millisecond)}, "not below half"},
		{"node timeout too long", []Option{WithDefaultTTL(time.Second), WithNodeTimeout(400 * time.Millisecond)}, "above a third"},
		{"node timeout tiny", []Option{WithNodeTimeout(time.Microsecond)}, "at least 1ms"},
		{"retry tiny", []Option{WithRetryInterval(0)}, "at least 1ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := New(three, tc.opts...)
			defer l.Close()
			if err := l.Err(); !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Err() = %v, want ErrInvalidOption with %q", err, tc.want)
			}
		})
	}
	// Per-call TTLs are checked against the same bounds.
	l := New(three, WithDriftMargin(600*time.Millisecond))
	defer l.Close()
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	_, err := l.TryAcquire(context.Background(), "k", locker.WithTTL(time.Second))
	if !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), "not below half") {
		t.Fatalf("per-call TTL too short for the drift: %v", err)
	}
	tm, err := (&config{}).timing(2 * time.Second)
	if err != nil || tm.drift != 140*time.Millisecond || tm.nodeTimeout != 200*time.Millisecond || tm.minValidity != 200*time.Millisecond {
		t.Fatalf("defaults for 2s: %+v, %v", tm, err)
	}
	tm, _ = (&config{}).timing(time.Hour)
	if tm.nodeTimeout != MaxNodeTimeout {
		t.Fatalf("node timeout for 1h: %v, want %v", tm.nodeTimeout, MaxNodeTimeout)
	}
}

// A majority that refuses connections: TryAcquire and Acquire fail at once
// with ErrNoQuorum saying what happened, not ErrNotAcquired, and not after
// waiting for the context.
func TestUnreachableMajority(t *testing.T) {
	l := New(clientsFor(t, deadAddrs(t, 3)))
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, op := range []string{"try", "acquire"} {
		var err error
		start := time.Now()
		if op == "try" {
			_, err = l.TryAcquire(ctx, "k")
		} else {
			_, err = l.Acquire(ctx, "k")
		}
		if !errors.Is(err, ErrNoQuorum) || errors.Is(err, locker.ErrNotAcquired) || ctx.Err() != nil {
			t.Fatalf("%s: %v, want ErrNoQuorum", op, err)
		}
		if !strings.Contains(err.Error(), "0 of 3 nodes granted, 0 held by another client, 3 failed or did not answer (need 2)") {
			t.Fatalf("%s: message does not count the nodes: %v", op, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("%s took %v", op, d)
		}
	}
	if _, err := l.Inspect(ctx, "k"); !errors.Is(err, ErrNoQuorum) {
		t.Fatalf("Inspect with no node answering: %v, want ErrNoQuorum", err)
	}
	if _, err := l.Inspect(ctx, ""); !errors.Is(err, locker.ErrInvalidKey) {
		t.Fatalf("Inspect of an empty key: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, locker.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

func TestRoundResultErrors(t *testing.T) {
	node := errors.New("node 3 (x): refused")
	for _, tc := range []struct {
		r       roundResult
		is      error
		isNot   error
		contain string
	}{
		{roundResult{n: 3, quorum: 2, granted: 1, denied: 2, held: true}, locker.ErrNotAcquired, ErrNoQuorum, "1 of 3 nodes granted, 2 held by another client, 0 failed or did not answer (need 2)"},
		{roundResult{n: 3, quorum: 2, granted: 1, denied: 2}, locker.ErrNotAcquired, ErrNoQuorum, "contenders split the nodes"},
		{roundResult{n: 3, quorum: 2, granted: 0, denied: 2, failed: 1, held: true, firstErr: node}, locker.ErrNotAcquired, ErrNoQuorum, "refused"},
		{roundResult{n: 3, quorum: 2, denied: 2, failed: 1, firstErr: node}, locker.ErrNotAcquired, ErrNoQuorum, "refused"},
		{roundResult{n: 3, quorum: 2, granted: 1, denied: 1, failed: 1, firstErr: node}, ErrNoQuorum, locker.ErrNotAcquired, "1 failed"},
		{roundResult{n: 5, quorum: 3, granted: 2, denied: 2, failed: 1, firstErr: node}, ErrNoQuorum, locker.ErrNotAcquired, "need 3"},
		{roundResult{n: 3, quorum: 2, granted: 1, denied: 1, failed: 1, firstErr: node}, node, nil, ""},
		{roundResult{n: 3, quorum: 2, granted: 2, why: "only 1ms left"}, ErrNoQuorum, locker.ErrNotAcquired, "only 1ms left"},
	} {
		err := tc.r.err()
		if !errors.Is(err, tc.is) || tc.isNot != nil && errors.Is(err, tc.isNot) || !strings.Contains(err.Error(), tc.contain) {
			t.Errorf("%+v: %v", tc.r, err)
		}
	}
	if (roundResult{n: 3, quorum: 2, failed: 2}).unreachable() != true || (roundResult{n: 3, quorum: 2, failed: 1}).unreachable() {
		t.Error("unreachable")
	}
}

func TestHolderLeft(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		pttls  []time.Duration
		quorum int
		want   time.Duration
	}{
		{[]time.Duration{300 * ms, 100 * ms}, 2, 100 * ms},                   // a bare majority: the first expiry ends it
		{[]time.Duration{300 * ms, 100 * ms, 200 * ms}, 2, 200 * ms},         // all three: the second
		{[]time.Duration{300 * ms}, 2, 0},                                    // not a majority
		{[]time.Duration{-1, 100 * ms}, 2, 0},                                // unknown
		{[]time.Duration{50 * ms, 10 * ms, 40 * ms, 30 * ms}, 3, 30 * ms},    // four of five
		{[]time.Duration{50 * ms, 10 * ms, 40 * ms, 30 * ms, 5}, 3, 30 * ms}, // five of five
	} {
		if got := holderLeft(tc.pttls, tc.quorum); got != tc.want {
			t.Errorf("holderLeft(%v, %d) = %v, want %v", tc.pttls, tc.quorum, got, tc.want)
		}
	}
}

func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		r    roundResult
		want bool
	}{
		{roundResult{n: 3, quorum: 2, granted: 1, denied: 2}, true},
		{roundResult{n: 3, quorum: 2, granted: 1, denied: 2, held: true}, false},
		{roundResult{n: 3, quorum: 2, granted: 0, denied: 1, failed: 2}, false}, // unreachable
		{roundResult{n: 3, quorum: 2, granted: 2, why: "x"}, false},
		{roundResult{n: 3, quorum: 2, granted: 1, failed: 2}, false},
	} {
		if got := tc.r.split(); got != tc.want {
			t.Errorf("%+v: split() = %v", tc.r, got)
		}
	}
}

// Key names are injective and the same on every node; the prefix applies.
func TestKeyNames(t *testing.T) {
	l := New(clientsFor(t, deadAddrs(t, 3)), WithPrefix("p:"))
	defer l.Close()
	seen := map[string]string{}
	for _, k := range []string{"a", "a:", "a:lock", "{a}", "a}", "ü", "a/b", "a b", "a\x00"[:1] + "b"} {
		lock, fence, ch := l.KeyNames(k)
		for _, name := range []string{lock, fence, ch} {
			if !strings.HasPrefix(name, "p:{") {
				t.Errorf("%q: name %q lacks the prefix", k, name)
			}
			if other, dup := seen[name]; dup {
				t.Errorf("keys %q and %q share the name %q", other, k, name)
			}
			seen[name] = k
		}
	}
}

func TestOpenURL(t *testing.T) {
	a := deadAddrs(t, 3)
	hosts := strings.Join(a, ",")
	for _, tc := range []struct {
		url  string
		want string
	}{
		{"redlock://" + a[0] + "," + a[1], "at least 3 nodes, got 2"},
		{"redlock://" + hosts + "," + a[0], "got 4"},
		{"redlock://" + hosts + "?bogus=1", "bogus"},
		{"redlock://" + hosts + "?ttl=abc", "not a duration"},
		{"redlock://" + hosts + "?ttl=100ms", "outside the portable range"},
		{"redlock://" + a[0] + "," + a[0] + "," + a[1], "same server"},
		{"redlock://" + a[0] + ",," + a[1], "empty node address"},
		{"redlock://user:s3cret@" + hosts + "?dial_timeout=zz", "dial_timeout"},
	} {
		l, err := locker.Open(context.Background(), tc.url)
		if err == nil {
			_ = l.Close()
			t.Errorf("%s: no error", tc.url)
			continue
		}
		if !errors.Is(err, locker.ErrInvalidURL) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalidURL with %q", tc.url, err, tc.want)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: error shows the password: %v", tc.url, err)
		}
	}
	for _, u := range []string{
		"redlock://" + hosts + "/2?ttl=5s&drift_margin=200ms&node_timeout=100ms&retry_interval=300ms&prefix=x:&read_timeout=1s",
		"rediss+redlock://user:pw@" + a[0] + "?addr=" + a[1] + "&addr=" + a[2],
	} {
		l, err := Open(context.Background(), u)
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		if n, _ := l.Nodes(); n != 3 || l.Err() != nil {
			t.Errorf("%s: %d nodes, Err %v", u, n, l.Err())
		}
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}
