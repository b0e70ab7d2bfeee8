package postgres_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/integration/testserver"
	_ "github.com/go-locker/locker/postgres" // registers postgres:// with locker.Open
)

// suiteInterval is the health-check interval of the conformance run's
// Lockers. It is longer than testInterval because make test runs the suite
// while other packages' suites load both cores under -race: a check waiting
// for a CPU for 500ms was reported as a loss (Keys/ManyHeld lost a lock with
// no fault injected), which is the documented behaviour of a check without
// an answer within one interval, and not what the suite is testing.
const suiteInterval = time.Second

func TestConformance(t *testing.T) {
	srv := testserver.Postgres(t)
	conformance.Run(t, conformanceHarness(t, srv, srv.DSN()))
}

// conformanceHarness is the suite's harness on srv: its Lockers connect
// with dsn (srv's address; a role or a TLS setting of the test's), and the
// hooks that act from outside (Steal) use srv.DSN().
func conformanceHarness(t *testing.T, srv *testserver.Server, dsn string) conformance.Harness {
	var proxies testserver.Registry[*testserver.Proxy]
	admin := newPool(t, srv.DSN(), 4)
	// Each client gets a proxy of its own, so that Crash and Cut act on
	// exactly that client, and a pool of its own (it is another process).
	// 30 connections cover ManyKeys plus waiters.
	client := func(t *testing.T, extra url.Values) (locker.Locker, error) {
		px := testserver.NewProxy(t, srv.Addr())
		params := url.Values{
			"pool_max_conns":       {"30"},
			"lock_health_interval": {suiteInterval.String()},
			"prefix":               {"conformance"},
		}
		for k, v := range extra {
			params[k] = v
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		l, err := locker.Open(ctx, withHost(t, dsn, px.Addr(), params))
		if err != nil {
			return nil, err
		}
		proxies.Put(l, px)
		t.Cleanup(func() { l.Close() })
		return l, nil
	}
	return conformance.Harness{
		IgnoreGoroutines: testserver.ProxyGoroutines,
		// A new Locker connects, and checks the token sequence, at its
		// first lock: on a loaded machine under -race that took more than
		// the 200ms in which the cases take a waiter for queued
		// (stillWaiting), so a waiter still connecting was taken for one
		// in the queue, and a reader that came later, on a Locker quicker
		// to connect, "overtook" it (RW/CancelledWriter failed so, once).
		// A first lock here, before the case starts, leaves a connection
		// in the pool and the sequence checked.
		NewLocker: func(t *testing.T) locker.Locker {
			l, err := client(t, nil)
			if err != nil {
				t.Fatalf("locker.Open: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			h, err := l.TryAcquire(ctx, fmt.Sprintf("warm-up/%d", time.Now().UnixNano()))
			if err != nil {
				t.Fatalf("warm-up TryAcquire of a new Locker: %v", err)
			}
			if err := h.Release(ctx); err != nil {
				t.Fatalf("warm-up Release of a new Locker: %v", err)
			}
			return l
		},
		// A server that ends sessions idle for idle_session_timeout (1.5s,
		// above pgxpool's 1s ping of idle connections, so that the pool
		// hands out no dead ones) would free a held lock between health
		// checks; the session that holds a lock has it set to the lock's
		// lease instead, which its health checks renew.
		Unsafe: []conformance.UnsafeConfig{{
			Name: "idle_session_timeout=1500ms",
			New: func(t *testing.T) (locker.Locker, error) {
				return client(t, url.Values{"options": {"--idle_session_timeout=1500ms"}})
			},
			MadeSafe: true,
		}},
		// Crash closes every connection of the client without an unlock, as
		// the kernel does for a killed process: the server ends those
		// sessions and so frees their locks, and the client can no longer
		// reach the server.
		Crash: func(t *testing.T, l locker.Locker) { proxies.Get(t, l, "Crash").Crash(t) },
		// Every connection of the client closed from outside (its sessions
		// end on the server, and their advisory locks with them).
		Reset: func(t *testing.T, l locker.Locker) { proxies.Get(t, l, "Reset").ResetAll(t) },
		// So a reset frees the lock on the server at the moment the holder's
		// socket breaks, and the holder's monitor hears of it from that
		// break: in CI another client's TryAcquire was 7ms quicker than
		// the monitor's wake-up once.
		ResetEndsLocks: "a session advisory lock lives as long as its session, which ends with its connection",
		// Cut partitions the client's proxy: its connections stay open but
		// nothing passes, as in a partition, and what was sent meanwhile
		// arrives when it heals (Proxy.Partition; a Blackhole's heal would
		// reset the connections, which ends a session lock). The server
		// keeps the session, and the lock, until the holder's health check
		// fails and the holder closes its connection (which the proxy
		// passes on, standing in for the server's keepalive). That is the
		// order the contract asks for: the holder hears of the loss before
		// anyone else can take the key. pg_terminate_backend would cut the
		// other way round — the server frees the lock first, and the holder
		// learns a moment later — which TestTerminatedBackend covers.
		Cut: func(t *testing.T, l locker.Locker) func() {
			px := proxies.Get(t, l, "Cut")
			px.Partition(t)
			return func() { px.Heal(t) }
		},
		// Steal ends the holder's session from another connection, as an
		// operator's pg_terminate_backend (or a failover) would: the server
		// frees the lock at once and the holder learns of it afterwards, by
		// its dead connection or its next health check.
		Steal: func(t *testing.T, h locker.Handle) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			pid := holderPIDIn(t, ctx, admin, "conformance", h.Key())
			if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
				t.Fatalf("Steal: pg_terminate_backend(%d): %v", pid, err)
			}
		},
		LossBound: 2 * suiteInterval,
		URL:       dsn,
		// The TTL bounds how long the server keeps a silent holder's
		// session (idle_session_timeout, TCP keepalive): the lease given is
		// the TTL asked, to the millisecond (no LeaseGrain).
		TTL:            2 * time.Second,
		NoInspectLease: "the lease is the holding session's idle_session_timeout, which another session cannot read",
		// Crash frees the key at once; Cut within two health-check
		// intervals (a missed idle period, then a check that times out),
		// for a holder and for a waiter alike. A cut that also loses the
		// holder's close is TestSilentHolderTTL's.
		ExpiryBound: 4 * suiteInterval * 2,
		// An Acquire whose ctx ends while it waits on the server sends a
		// cancel request and returns when the statement ends, or closes
		// the socket after a second if it has not (postgres/doc.go: "after
		// at most a second"); on a loaded machine the cancel can take that
		// second (Context/DeadlineWhileWaiting: 1.002s once in make test).
		CtxSlack:     1200 * time.Millisecond,
		HandoffBound: time.Second,
		ManyKeys:     20,
	}
}
