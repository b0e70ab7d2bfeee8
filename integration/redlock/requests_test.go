package redlock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/redis/redlock"
)

// An uncontended Acquire+Release on nodes whose counters agree costs two
// requests per node: the grant and the release. Every node's grant returns
// the same counter value, the token, and sets it while the lock is there,
// which is what the fencing write-back would establish (see "Fencing
// tokens" in the package documentation): the write-back round is needed
// only when the values of a majority differ (TestTokensAfterEarlyExpiry
// and TestTokensAfterNodeLostCounter are that case). The token the grant
// recorded is the one Inspect reports. And the scripts run few commands on
// the node: with nobody queued, the grant reads no clock and purges no
// queue (GET the lock, the two late-request checks, ZCARD the queue, INCR,
// SET: 6), nor does the release purge (TIME, ZRANGE the queue's head, GET,
// DEL and the release record's ZADD, ZREMRANGEBYRANK, PEXPIRE: 7).
func TestUncontendedRequests(t *testing.T) {
	const nodes, cycles = 3, 20
	addrs, ctx, key, trips, l, last := warmLocker(t, nodes)
	adm := admins(t, addrs)
	cmds0 := scriptCommands(t, adm)
	before := trips.trips.Load()
	for i := range cycles {
		h, err := l.Acquire(ctx, key)
		if err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		if h.Token() <= last {
			t.Fatalf("cycle %d: token %d after %d", i, h.Token(), last)
		}
		last = h.Token()
		if err := h.Release(ctx); err != nil {
			t.Fatalf("cycle %d: release: %v", i, err)
		}
	}
	perNode := float64(trips.trips.Load()-before) / cycles / nodes
	cmdsPerNode := float64(scriptCommands(t, adm)-cmds0) / cycles / nodes
	t.Logf("%.2f requests and %.2f commands run by the scripts per node per uncontended Acquire+Release", perNode, cmdsPerNode)
	if cmdsPerNode > 13 {
		t.Errorf("%.2f commands run by the scripts per node per uncontended Acquire+Release, want at most 13: the clock and the queue's purge with nobody queued", cmdsPerNode)
	}
	if perNode > 2 {
		t.Errorf("%.2f requests per node per uncontended Acquire+Release, want 2 (the grant and the release): a write-back round the nodes' agreeing counters made needless", perNode)
	}

	h, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release(ctx)
	info, err := l.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held || info.Token != h.Token() {
		t.Fatalf("Inspect: held %v, token %d; the holder's token is %d", info.Held, info.Token, h.Token())
	}
}

// When one node's counter is ahead of the others' (two rounds reached the
// nodes in different orders: a newcomer's first round took a provisional
// ticket there before the woken waiter's grant, and after it elsewhere),
// the token is the value the other nodes, a majority, returned: the grant
// is the whole acquisition, with no write-back, and the token is still
// above every earlier holder's (see "Fencing tokens"). Inspect reports the
// token a majority records, not the larger value of the node ahead, and
// the next holder gets a larger token.
func TestOneNodeAheadNeedsNoWriteBack(t *testing.T) {
	const nodes = 3
	addrs, ctx, key, trips, l, first := warmLocker(t, nodes)
	adm := admins(t, addrs)
	lockName, _, _ := l.KeyNames(key)
	fence := strings.TrimSuffix(lockName, ":lock") + ":fence"
	for i, a := range adm {
		if err := a.Set(ctx, fence, 100+boolInt(i == nodes-1), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	before := trips.trips.Load()
	h, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	sent := trips.trips.Load() - before
	t.Logf("token %d after %d; %d requests, counters 100, 100 and 101 before", h.Token(), first, sent)
	if h.Token() != 101 {
		t.Errorf("token %d, want 101: the value two of the three nodes returned", h.Token())
	}
	if sent != nodes {
		t.Errorf("%d requests for the acquisition, want %d (the grant alone): a write-back round the majority's common value made needless", sent, nodes)
	}
	info, err := l.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held || info.Token != h.Token() {
		t.Errorf("Inspect: held %v, token %d; the holder's token is %d", info.Held, info.Token, h.Token())
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	if next.Token() <= h.Token() {
		t.Errorf("the next holder's token is %d, want above %d", next.Token(), h.Token())
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// warmLocker is a Locker on nodes nodes whose clients' requests trips
// counts, and a key it acquired and released once (which also vets the
// nodes and caches the scripts), with that acquisition's token.
func warmLocker(t *testing.T, nodes int) (addrs []string, ctx context.Context, key string, trips *roundTrips, l *redlock.Locker, token int64) {
	t.Helper()
	addrs = nodeAddrs(t, nodes)
	ctx = testCtx(t, 60*time.Second)
	key = uniqueKey(t)
	trips = &roundTrips{}
	cs := benchClients(t, addrs)
	for _, c := range cs {
		c.AddHook(trips)
	}
	l = redlock.New(universal(cs))
	t.Cleanup(func() { _ = l.Close() })
	h, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	return addrs, ctx, key, trips, l, h.Token()
}

// scriptCommands sums, over the nodes, the calls of the commands that
// scripts run (INFO commandstats, without the scripts themselves and the
// clients' own commands).
func scriptCommands(t *testing.T, adm []*goredis.Client) (n int64) {
	t.Helper()
	skip := []string{"evalsha", "eval", "info", "config", "hello", "client", "ping", "script", "select", "subscribe", "unsubscribe", "command"}
	for _, a := range adm {
	names:
		for name, calls := range commandCalls(t, a) {
			for _, s := range skip {
				if name == s || strings.HasPrefix(name, s+"|") {
					continue names
				}
			}
			n += calls
		}
	}
	return n
}
