package redlock_test

import (
	"testing"
	"time"

	"github.com/go-locker/locker/redis/redlock"
)

// An uncontended Acquire+Release on nodes whose counters agree costs two
// requests per node: the grant and the release. Every node's grant returns
// the same counter value, the token, and sets it while the lock is there,
// which is what the fencing write-back would establish (see "Fencing
// tokens" in the package documentation): the write-back round is needed
// only when the values of a majority differ (TestTokensAfterEarlyExpiry
// and TestTokensAfterNodeLostCounter are that case). The token the grant
// recorded is the one Inspect reports.
func TestUncontendedRequests(t *testing.T) {
	const nodes, cycles = 3, 20
	addrs := nodeAddrs(t, nodes)
	ctx := testCtx(t, 60*time.Second)
	key := uniqueKey(t)
	trips := &roundTrips{}
	cs := benchClients(t, addrs)
	for _, c := range cs {
		c.AddHook(trips)
	}
	l := redlock.New(universal(cs))
	t.Cleanup(func() { _ = l.Close() })

	// The first acquisition also vets the nodes and caches the scripts.
	h, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	last := h.Token()
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
	t.Logf("%.2f requests per node per uncontended Acquire+Release", perNode)
	if perNode > 2 {
		t.Errorf("%.2f requests per node per uncontended Acquire+Release, want 2 (the grant and the release): a write-back round the nodes' agreeing counters made needless", perNode)
	}

	h, err = l.Acquire(ctx, key)
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
