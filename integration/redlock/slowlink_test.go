package redlock_test

import (
	"testing"
	"time"

	"github.com/go-locker/locker/redis/redlock"
)

// A node whose connections were cut (a restart, a load balancer, a request
// cut by the node timeout, after which go-redis drops the connection) on a
// link whose round trip is over a third of the node timeout (600ms of 1s
// here: a distant node with a tight timeout) must come back. A request on
// a new connection takes the handshake's round trips (HELLO, CLIENT
// SETINFO) and its own: more than the node timeout. Once the node counts
// as down, its requests must still get the time to dial (the client's dial
// timeout, at most 1s), though the round need not wait for them: so the
// connection is made, and a later round, on it, fits the timeout. Two of
// three nodes are cut; a few calls later the third is cut off entirely,
// so that a call acquires only if both came back.
func TestReconnectOnSlowLink(t *testing.T) {
	addrs := nodeAddrs(t, 3)
	ctx := testCtx(t, 90*time.Second)
	c := newLocker(t, addrs, redlock.WithDefaultTTL(30*time.Second), redlock.WithNodeTimeout(time.Second))
	key := uniqueKey(t)
	warm(t, c.l, key)
	for _, px := range c.pxs {
		px.Latency(t, 600*time.Millisecond)
	}
	h, err := c.l.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire on the slow link, connections made: %v", err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	c.pxs[0].ResetAll(t)
	c.pxs[1].ResetAll(t)
	// The calls that find the connections gone, whose requests the node
	// timeout cuts while they dial.
	for i := range 3 {
		if h, err := c.l.TryAcquire(ctx, key); err == nil {
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
		} else {
			t.Logf("call %d after the cut: %v", i+1, err)
		}
	}
	c.pxs[2].Blackhole(t)
	const attempts = 3
	var errs []error
	for i := range attempts {
		h, err := c.l.TryAcquire(ctx, key)
		if err == nil {
			t.Logf("acquired on nodes 1 and 2 at attempt %d", i+1)
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
			return
		}
		errs = append(errs, err)
	}
	t.Fatalf("no TryAcquire of %d acquired on nodes 1 and 2, three calls after their connections were cut on a link 600ms away with a node timeout of 1s: %v", attempts, errs)
}
