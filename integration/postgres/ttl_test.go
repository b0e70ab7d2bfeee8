package postgres_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/postgres"
)

// silentSlack is how long, beyond its lease, a holder that went silent may
// still keep another client from the key: the server ends the silent
// session by its idle_session_timeout a few milliseconds after the lease
// (the timer fires, the backend exits), and the waiter, queued on the
// server, is granted the lock as the backend's locks are released; the rest
// is scheduling on a loaded test machine.
const silentSlack = time.Second

// TestSilentHolderTTL: a holder whose link goes silent both ways, its own
// close included (Proxy.Silence: the server never learns that the holder
// gave up), keeps the key from others no longer than its TTL, and reports
// the loss before anybody else holds the key. A blackhole that passed the
// holder's close would free the key when the holder gives up, and prove
// nothing about the server: here the server must end the session by
// itself.
//
// "Checks": health checks every testInterval, whose deadline (one
// interval) tells the holder of the silence long before the lease runs
// out. "LeaseOnly": a health-check interval longer than the test, so that
// the holder checks every third of the TTL and learns of the silence from
// its lease alone (the last answered check's send time + TTL − drift
// margin), the tight case: the server frees the key a drift margin later.
// The silence falls at a random phase of the checks.
func TestSilentHolderTTL(t *testing.T) {
	for _, mode := range []struct {
		name     string
		interval time.Duration
	}{{"Checks", testInterval}, {"LeaseOnly", time.Hour}} {
		for _, ttl := range []time.Duration{2 * time.Second, 5 * time.Second} {
			t.Run(mode.name+"/"+ttl.String(), func(t *testing.T) {
				silentHolder(t, ttl, mode.interval)
			})
		}
	}
}

func silentHolder(t *testing.T, ttl, interval time.Duration) {
	ctx := testCtx(t)
	srv := testserver.Postgres(t)
	px := testserver.NewProxy(t, srv.Addr())
	holder := newLocker(t, newPool(t, withHost(t, srv.DSN(), px.Addr(), nil), 2), postgres.WithHealthCheckInterval(interval))
	other := newLocker(t, sharedPool(t, 2))
	k := testKey(t, "")
	h1, err := holder.Acquire(ctx, k, locker.WithTTL(ttl))
	if err != nil {
		t.Fatalf("Acquire with WithTTL(%v): %v", ttl, err)
	}
	if got := h1.TTL(); got != ttl {
		t.Errorf("Handle.TTL() = %v, want the TTL asked, %v", got, ttl)
	}
	// Let a health check or two pass, so that the silence falls at
	// some phase of them, not right after the grant.
	period := min(interval, ttl/3)
	phase := period + rand.N(period)
	time.Sleep(phase)
	select {
	case <-h1.Done():
		t.Fatalf("the holder lost its lock before the link went silent: %v", h1.Err())
	default:
	}

	lost := make(chan time.Time, 1)
	go func() {
		<-h1.Done()
		lost <- time.Now()
	}()
	px.Silence(t)
	cut := time.Now()
	actx, cancel := context.WithTimeout(ctx, ttl+silentSlack)
	h2, err := other.Acquire(actx, k)
	cancel()
	got := time.Now()
	if err != nil {
		t.Fatalf("a holder silent since %v ago still kept the key: its TTL was %v (slack %v): %v", got.Sub(cut).Round(time.Millisecond), ttl, silentSlack, err)
	}
	defer mustRelease(t, ctx, h2)
	// When the key was granted, the holder's Done must have been closed
	// already, by its monitor: a look at h1.Done() now would be no proof,
	// since it checks the clock and would close it (see Handle.Err). The
	// goroutine above timed the close, a moment after it happened.
	var lossAt time.Time
	select {
	case lossAt = <-lost:
	case <-time.After(100 * time.Millisecond):
		t.Fatalf("another client held the key %v after the holder went silent, and the holder had not reported the loss", got.Sub(cut).Round(time.Millisecond))
	}
	if !lossAt.Before(got) {
		t.Fatalf("another client held the key %v after the holder went silent, and the holder reported the loss only at +%v", got.Sub(cut).Round(time.Millisecond), lossAt.Sub(cut).Round(time.Millisecond))
	}
	t.Logf("TTL %v, checks every %v, silent %v after the grant: the silent holder reported the loss at +%v, another client held the key at +%v",
		ttl, period, phase.Round(time.Millisecond), lossAt.Sub(cut).Round(time.Millisecond), got.Sub(cut).Round(time.Millisecond))
	if !errors.Is(h1.Err(), locker.ErrLost) {
		t.Errorf("the silent holder's Err() = %v, want ErrLost", h1.Err())
	}
	if d := lossAt.Sub(cut); d > ttl {
		t.Errorf("the silent holder reported the loss %v after the link went silent, more than its TTL %v", d, ttl)
	}
	if h2.Token() <= h1.Token() {
		t.Errorf("the next holder's token %d is not above the silent holder's %d", h2.Token(), h1.Token())
	}
}

// leaseSettings are the session settings that keep a held lock's lease on
// the server (see the package documentation).
var leaseSettings = []string{"idle_session_timeout", "tcp_user_timeout", "tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count"}

// showSettings returns the current values of leaseSettings on the one
// connection of pool (while no lock pins it).
func showSettings(t *testing.T, ctx context.Context, pool *pgxpool.Pool) []string {
	t.Helper()
	var vals []string
	if err := pool.QueryRow(ctx, `SELECT array_agg(current_setting(n) ORDER BY i) FROM unnest($1::text[]) WITH ORDINALITY AS s(n, i)`, leaseSettings).Scan(&vals); err != nil {
		t.Fatalf("reading the session settings: %v", err)
	}
	return vals
}

// TestLeaseSettingsRestored: the session that holds a lock has the lease's
// settings while it holds it, and its connection goes back to the pool
// with the settings it had (here set in the DSN, as an application's
// would be), after a release, a TryAcquire that was refused, and a wait
// that gave up.
func TestLeaseSettingsRestored(t *testing.T) {
	ctx := testCtx(t)
	srv := testserver.Postgres(t)
	// Non-default values, as a DSN or a role's settings would give them.
	// (pgx sends parameters it does not know to the server as settings.)
	own := url.Values{"idle_session_timeout": {"3600s"}, "tcp_user_timeout": {"123456"},
		"tcp_keepalives_idle": {"77"}, "tcp_keepalives_interval": {"11"}, "tcp_keepalives_count": {"5"}}
	pool := newPool(t, withHost(t, srv.DSN(), "", own), 1)
	l := newLocker(t, pool)
	other := newLocker(t, sharedPool(t, 2))
	before := showSettings(t, ctx, pool)
	if before[0] != "1h" || before[2] != "77" {
		t.Fatalf("the DSN's settings did not take: %v", before)
	}
	check := func(after string) {
		t.Helper()
		if got := showSettings(t, ctx, pool); !slices.Equal(got, before) {
			t.Errorf("after %s, the pooled connection has %v = %v, want %v as before", after, leaseSettings, got, before)
		}
	}

	// (What the settings are while held cannot be read from another
	// session; TestSilentHolderTTL shows their effect.)
	k := testKey(t, "")
	h, err := l.Acquire(ctx, k, locker.WithTTL(2*time.Second))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	mustRelease(t, ctx, h)
	check("a release")

	h2 := mustAcquire(t, ctx, other, k)
	if _, err := l.TryAcquire(ctx, k, locker.WithTTL(2*time.Second)); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key: %v, want ErrNotAcquired", err)
	}
	check("a refused TryAcquire")

	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = l.Acquire(wctx, k, locker.WithTTL(2*time.Second))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire of a held key with a 300ms deadline: %v, want DeadlineExceeded", err)
	}
	check("an abandoned wait")
	mustRelease(t, ctx, h2)

	// A wait that is granted, then released.
	h3, err := l.Acquire(ctx, k, locker.WithTTL(2*time.Second))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	mustRelease(t, ctx, h3)
	check("a granted wait, released")
}
