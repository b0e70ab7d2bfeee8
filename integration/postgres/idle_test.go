package postgres_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/postgres"
)

// TestIdleSessionTimeout: a session lock is held on a connection that is
// idle between health checks, and PostgreSQL 14+ ends a session idle for
// idle_session_timeout (set per role, per database or, as here, per
// session in the DSN: no restart). The holder must keep its lock, or know
// it lost it before anybody else holds the key: never a second holder while
// the first handle still says held. The holder's health checks (10s) are
// far apart compared to the timeout (1s). "Direct": the holder connects
// directly; "SlowLink": its link delays the server's bytes by 200ms (a
// holder farther from the server than the next client), so that a FATAL
// message the server sends as it ends the session reaches the holder only
// after the other client may have been granted the key.
func TestIdleSessionTimeout(t *testing.T) {
	srv := testserver.Postgres(t)
	requirePG(t, 140000, "idle_session_timeout")
	for _, slow := range []bool{false, true} {
		name := "Direct"
		if slow {
			name = "SlowLink"
		}
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			addr := ""
			if slow {
				px := testserver.NewProxy(t, srv.Addr())
				px.Latency(t, 200*time.Millisecond)
				addr = px.Addr()
			}
			idle := url.Values{"idle_session_timeout": {"1s"}}
			pool1 := newPool(t, withHost(t, srv.DSN(), addr, idle), 4)
			l1 := newLocker(t, pool1, postgres.WithHealthCheckInterval(10*time.Second))
			l2 := newLocker(t, sharedPool(t, 4))
			k := testKey(t, "")
			h1 := mustAcquire(t, ctx, l1, k)
			if !noSecondHolder(t, ctx, h1, l2, k, 5*time.Second) {
				return
			}
			// The released connection went back to the pool with the
			// session's own setting, not with the timeout turned off.
			idleConns := pool1.AcquireAllIdle(ctx)
			if len(idleConns) == 0 {
				t.Fatal("no idle connection in the holder's pool after the release")
			}
			for _, c := range idleConns {
				var v string
				err := c.QueryRow(ctx, "SHOW idle_session_timeout").Scan(&v)
				c.Release()
				if err != nil {
					t.Fatalf("SHOW idle_session_timeout on a pooled connection: %v", err)
				}
				if v != "1s" {
					t.Errorf("a pooled connection has idle_session_timeout %q after the release, want the DSN's 1s", v)
				}
			}
		})
	}
}

// noSecondHolder holds h1 for hold while l2 waits for the same key, and
// decides by the order of events: when l2 gets the key, h1 must already be
// Done with ErrLost; if h1 is still held after hold, l2 must not have the
// key, and gets it after h1's Release. It reports whether h1 was kept.
func noSecondHolder(t *testing.T, ctx context.Context, h1 locker.Handle, l2 locker.Locker, k string, hold time.Duration) (kept bool) {
	t.Helper()
	type grant struct {
		h      locker.Handle
		err    error
		h1Err  error // h1.Err() the moment l2's Acquire returned
		h1Done bool
	}
	got := make(chan grant, 1)
	go func() {
		h, err := l2.Acquire(ctx, k)
		g := grant{h: h, err: err, h1Err: h1.Err()}
		select {
		case <-h1.Done():
			g.h1Done = true
		default:
		}
		got <- g
	}()
	release := func(g grant) {
		if g.h != nil {
			g.h.Release(context.Background())
		}
	}
	select {
	case g := <-got:
		defer release(g)
		if g.err != nil {
			t.Fatalf("second client's Acquire: %v", g.err)
		}
		if !g.h1Done || !errors.Is(g.h1Err, locker.ErrLost) {
			t.Fatalf("second holder while the first still says held: the second client got the key (token %d) when the first handle had Err() = %v, Done closed %v", g.h.Token(), g.h1Err, g.h1Done)
		}
		t.Logf("the holder lost its lock and knew it before the second client got it: %v", g.h1Err)
		return false
	case <-time.After(hold):
	}
	if err := h1.Err(); err != nil {
		// Lost, and reported; the second client must then get the key.
		t.Logf("the holder lost its lock (reported): %v", err)
		g := <-got
		release(g)
		if g.err != nil {
			t.Fatalf("second client's Acquire after the loss: %v", g.err)
		}
		return false
	}
	t.Logf("the holder kept its lock for %v", hold)
	mustRelease(t, ctx, h1)
	select {
	case g := <-got:
		release(g)
		if g.err != nil {
			t.Fatalf("second client's Acquire after the release: %v", g.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the second client did not get the key within 30s of the release")
	}
	return true
}

// requirePG skips the test on a server older than version (as
// server_version_num), which lacks what.
func requirePG(t *testing.T, version int, what string) {
	t.Helper()
	var v int
	if err := sharedPool(t, 1).QueryRow(testCtx(t), "SELECT current_setting('server_version_num')::int").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v < version {
		t.Skipf("server version %d has no %s", v, what)
	}
}

// TestProxyDropsIdleConnections: a proxy between the holder and the server
// closes connections on which the client sent nothing for a while (a load
// balancer's or NAT's idle timeout). "ChecksBelowIdle": health checks more
// frequent than the proxy's idle timeout keep the link busy, and the holder
// keeps its lock. "ChecksAboveIdle": the link is dropped while held, which
// ends the session; the server frees the lock as soon as it sees the close,
// which may be before the holder sees its end of it (no timeout of the
// client can order that, as with pg_terminate_backend: see "Failure modes"
// in the package documentation, which says to keep the interval below such
// a timeout). The holder must then report the loss at once, by the closed
// link, not a check later; the order against the next holder is not
// asserted (under load it went either way).
func TestProxyDropsIdleConnections(t *testing.T) {
	srv := testserver.Postgres(t)
	t.Run("ChecksBelowIdle", func(t *testing.T) {
		ctx := testCtx(t)
		px := testserver.NewProxy(t, srv.Addr())
		px.DropIdle(t, 2*time.Second)
		l1 := newLocker(t, newPool(t, withHost(t, srv.DSN(), px.Addr(), nil), 4), postgres.WithHealthCheckInterval(500*time.Millisecond))
		l2 := newLocker(t, sharedPool(t, 4))
		k := testKey(t, "")
		h1 := mustAcquire(t, ctx, l1, k)
		if !noSecondHolder(t, ctx, h1, l2, k, 5*time.Second) {
			t.Error("the holder lost its lock although its health checks (every 500ms) kept the link busier than the proxy's idle timeout (2s)")
		}
	})
	t.Run("ChecksAboveIdle", func(t *testing.T) {
		ctx := testCtx(t)
		px := testserver.NewProxy(t, srv.Addr())
		px.DropIdle(t, time.Second)
		l1 := newLocker(t, newPool(t, withHost(t, srv.DSN(), px.Addr(), nil), 4), postgres.WithHealthCheckInterval(time.Minute))
		k := testKey(t, "")
		h1 := mustAcquire(t, ctx, l1, k)
		// Dropped after 1s idle; reported by the closed link, long before
		// a check (1 minute).
		waitDone(t, h1, 10*time.Second, "holder whose link the proxy dropped")
		if !errors.Is(h1.Err(), locker.ErrLost) {
			t.Fatalf("Err() = %v, want ErrLost", h1.Err())
		}
		h2 := mustAcquire(t, ctx, newLocker(t, sharedPool(t, 4)), k)
		if h2.Token() <= h1.Token() {
			t.Errorf("next holder's token %d not above %d", h2.Token(), h1.Token())
		}
		mustRelease(t, ctx, h2)
	})
}
