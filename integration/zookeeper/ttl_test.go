package zookeeper_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/zookeeper"
)

// The TTL contract on ZooKeeper (issue 29): every TTL of the portable range
// works on every Locker, whatever the lease of its first session, and a
// lock's lease (Handle.TTL) is the timeout the server granted the session
// that owns its node.

// defaultClient connects a Locker with no options at all, through a proxy
// of its own: its first session is the one of the default TTL, which the
// test server (tickTime=500ms, so maxSessionTimeout 10s) grants as 10s.
func defaultClient(t *testing.T, addr string) client {
	t.Helper()
	px := testserver.NewProxy(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := zookeeper.Connect(ctx, []string{px.Addr()})
	if err != nil {
		t.Fatalf("zookeeper.Connect: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return client{l, px}
}

// silentHolder is what one run of a cut holder measured: when, after the
// cut, the holder reported the loss and another client got the key.
type silentHolder struct {
	lease      time.Duration // the holder's Handle.TTL
	lost, got  time.Duration // after the cut
	lostBefore bool          // the loss was reported before the key went to the other client
}

// cutHolderWithTTL takes key with WithTTL(ttl) on a (whose proxy it then
// blackholes: nothing passes either way), while b waits for the key, and
// measures when a reports the loss and when b gets the key. It fails the
// test unless b gets the key within the lease a's handle reported plus
// slack.
func cutHolderWithTTL(t *testing.T, ctx context.Context, a, b client, key string, ttl, slack time.Duration) silentHolder {
	t.Helper()
	h, err := a.l.TryAcquire(ctx, key, locker.WithTTL(ttl))
	if err != nil {
		t.Fatalf("TryAcquire with WithTTL(%v) on a Locker whose first session is %v: %v, want success: every TTL of [%v, %v] works",
			ttl, a.l.SessionTimeout(), err, locker.MinTTL, locker.MaxTTL)
	}
	lease := h.TTL()
	if lease <= 0 || lease > ttl {
		t.Fatalf("Handle.TTL() = %v for WithTTL(%v) on a server that grants it (minSessionTimeout 1s): want the lease the server granted, at most the TTL", lease, ttl)
	}
	lostAt := make(chan time.Time, 1)
	go func() {
		<-h.Done()
		lostAt <- time.Now()
	}()
	got := make(chan time.Time, 1)
	gotErr := make(chan error, 1)
	wctx, cancel := context.WithTimeout(ctx, lease+slack+5*time.Second)
	defer cancel()
	// b queues first, so that the moment its watch fires is the moment
	// the server deleted a's node.
	go func() {
		g, err := b.l.Acquire(wctx, key)
		if err != nil {
			gotErr <- err
			return
		}
		got <- time.Now()
		_ = g.Release(context.Background())
	}()
	mustNotTryKey(t, ctx, b.l, key)
	answeredBeforeCut(t, ctx, a.l, key)
	a.px.Blackhole(t)
	cut := time.Now()
	defer a.px.Heal(t)
	var r silentHolder
	r.lease = lease
	var gotAt time.Time
	select {
	case gotAt = <-got:
	case err := <-gotErr:
		t.Fatalf("b's Acquire of the key of a holder with lease %v cut off %v ago: %v", lease, time.Since(cut).Round(time.Millisecond), err)
	}
	r.got = gotAt.Sub(cut)
	select {
	case <-h.Done():
		r.lostBefore = true
	default:
	}
	select {
	case at := <-lostAt:
		r.lost = at.Sub(cut)
	case <-time.After(10 * time.Second):
		t.Fatalf("the cut holder never reported the loss")
	}
	if !errors.Is(h.Err(), locker.ErrLost) {
		t.Fatalf("the cut holder's Err() = %v, want ErrLost", h.Err())
	}
	if r.got > lease+slack {
		t.Errorf("the key of a holder with WithTTL(%v) (lease %v) went to another client only %v after the holder was cut off: want within the lease + %v",
			ttl, lease, r.got.Round(time.Millisecond), slack)
	}
	if !r.lostBefore {
		t.Errorf("the cut holder had not reported the loss when the other client got the key (%v after the cut)", r.got.Round(time.Millisecond))
	}
	return r
}

// mustNotTryKey checks that key is held: another Locker's TryAcquire fails
// with ErrNotAcquired.
func mustNotTryKey(t *testing.T, ctx context.Context, l locker.Locker, key string) {
	t.Helper()
	h, err := l.TryAcquire(ctx, key)
	if err == nil {
		_ = h.Release(ctx)
		t.Fatalf("TryAcquire of a held key succeeded")
	}
	if !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key: %v, want ErrNotAcquired", err)
	}
}

// A lock with WithTTL(1s) on a Locker whose first session is 10s (the
// default): it is taken (not refused for being below the session
// timeout), reports a lease of 1s, and once its holder is cut off its key
// goes to another client within about 1s, not 10s.
func TestShortTTLOnLongSessionLocker(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	a, b := defaultClient(t, srv.Addr()), newClient(t, srv.Addr())
	ctx := ctxFor(t, time.Minute)
	if st := a.l.SessionTimeout(); st < 5*time.Second {
		t.Fatalf("the default Locker's session timeout is %v: the test needs one far above the TTL asked", st)
	}
	r := cutHolderWithTTL(t, ctx, a, b, testKey(t), time.Second, time.Second)
	if r.lease != time.Second {
		t.Errorf("Handle.TTL() = %v for WithTTL(1s) on a server that grants 1s sessions, want 1s", r.lease)
	}
	t.Logf("lease %v: loss reported %v after the cut, key taken by another client %v after it",
		r.lease, r.lost.Round(time.Millisecond), r.got.Round(time.Millisecond))
}

// The program: a Locker opened from a URL with no parameters, and
// locker.Do with WithTTL(5s) in rounds from two Lockers (every round
// failed before: "TTL 5s is below the session timeout 10s"). One holder
// at a time, tokens rising, TryDo refused while the key is held, and the
// lease given reported (5s: the test server grants it).
func TestTTL5sOnDefaultLocker(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	ctx := ctxFor(t, time.Minute)
	var ls [2]locker.Locker
	for i := range ls {
		l, err := locker.Open(ctx, "zookeeper://"+srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		ls[i] = l
	}
	k := testKey(t)
	var (
		mu      sync.Mutex
		holders int
		last    int64
		errs    []error
	)
	var wg sync.WaitGroup
	for i, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := range 10 {
				err := locker.Do(ctx, l, k, func(ctx context.Context, h locker.Handle) error {
					mu.Lock()
					holders++
					n, prev := holders, last
					last = h.Token()
					mu.Unlock()
					defer func() {
						mu.Lock()
						holders--
						mu.Unlock()
					}()
					if n != 1 {
						return fmt.Errorf("%d holders at once", n)
					}
					if h.Token() <= prev {
						return fmt.Errorf("token %d not above the previous %d", h.Token(), prev)
					}
					if h.TTL() != 5*time.Second {
						return fmt.Errorf("Handle.TTL() = %v for WithTTL(5s), want 5s", h.TTL())
					}
					if err := locker.TryDo(ctx, ls[1-i], k, func(context.Context, locker.Handle) error { return nil }, locker.WithTTL(5*time.Second)); !errors.Is(err, locker.ErrNotAcquired) {
						return fmt.Errorf("TryDo of the held key from the other Locker: %v, want ErrNotAcquired", err)
					}
					return nil
				}, locker.WithTTL(5*time.Second))
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("Locker %d, round %d: %w", i, round, err))
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
}

// Measures, over several runs, when a cut-off holder with WithTTL(2s)
// reports the loss and when the next holder gets the key (logged; the
// bound is the lease + 1s: the server's expiry runs on ticks of 500ms).
func TestSilentHolderTTL2s(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	ctx := ctxFor(t, 2*time.Minute)
	b := newClient(t, srv.Addr())
	const runs = 5
	var lost, got []time.Duration
	for i := range runs {
		a := defaultClient(t, srv.Addr())
		r := cutHolderWithTTL(t, ctx, a, b, fmt.Sprintf("%s/%d", testKey(t), i), 2*time.Second, time.Second)
		if r.lease != 2*time.Second {
			t.Errorf("run %d: Handle.TTL() = %v, want 2s", i, r.lease)
		}
		lost, got = append(lost, r.lost), append(got, r.got)
		t.Logf("run %d: lease %v, loss reported at +%v, next holder at +%v", i, r.lease, r.lost.Round(time.Millisecond), r.got.Round(time.Millisecond))
	}
	sort.Slice(lost, func(i, j int) bool { return lost[i] < lost[j] })
	sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
	t.Logf("over %d runs: loss reported at +%v..+%v (median %v), next holder at +%v..+%v (median %v)", runs,
		lost[0].Round(time.Millisecond), lost[runs-1].Round(time.Millisecond), lost[runs/2].Round(time.Millisecond),
		got[0].Round(time.Millisecond), got[runs-1].Round(time.Millisecond), got[runs/2].Round(time.Millisecond))
}

// sessionsOn returns the ids of the sessions connected to the server at
// addr (the four-letter command cons, which the server must allow).
func sessionsOn(t *testing.T, addr string) map[int64]bool {
	t.Helper()
	// FLWCons reports !ok for the line of its own connection (no
	// session), which it cannot parse; it lists the others.
	res, _ := zk.FLWCons([]string{addr}, 5*time.Second)
	if len(res) != 1 || res[0].Error != nil {
		t.Fatalf("cons on %s: %+v", addr, res)
	}
	ids := map[int64]bool{}
	for _, c := range res[0].Clients {
		if c.SessionID != 0 {
			ids[c.SessionID] = true
		}
	}
	return ids
}

// One session per lease in use: locks whose TTLs round down to one lease
// step share a session, a TTL beyond the server's ceiling is the
// ceiling's session (the primary one here: the default TTL, 30s, is
// granted 10s), and a session other than the primary one is closed once
// idle: a Locker without a lock keeps no extra session. Counted on the
// server (cons), on a server of the test's own.
func TestSessionPerLease(t *testing.T) {
	srv := testserver.NewZooKeeperWith(t, "4lw.commands.whitelist=ruok,srvr,stat,cons")
	a := defaultClient(t, srv.Addr())
	ctx := ctxFor(t, 2*time.Minute)
	k := testKey(t)
	primary := a.l.Conn().SessionID()
	if got := sessionsOn(t, srv.Addr()); len(got) != 1 || !got[primary] {
		t.Fatalf("sessions on the server after Connect: %v, want the primary one %#x only", got, primary)
	}
	take := func(key string, ttl time.Duration) *zookeeper.Handle {
		t.Helper()
		h, err := a.l.TryAcquire(ctx, key, locker.WithTTL(ttl))
		if err != nil {
			t.Fatalf("TryAcquire with WithTTL(%v): %v", ttl, err)
		}
		return h.(*zookeeper.Handle)
	}
	h2 := take(k+"/2s", 2*time.Second)
	h25 := take(k+"/2.5s", 2500*time.Millisecond) // rounded down to the 2s step
	hDay := take(k+"/24h", locker.MaxTTL)         // the ceiling: the primary session
	if h2.TTL() != 2*time.Second || h25.TTL() != 2*time.Second || hDay.TTL() != 10*time.Second {
		t.Errorf("leases %v, %v, %v for WithTTL(2s), (2.5s), (24h), want 2s, 2s (the lease step below 2.5s) and 10s (maxSessionTimeout)", h2.TTL(), h25.TTL(), hDay.TTL())
	}
	if h2.SessionID() == primary || h25.SessionID() != h2.SessionID() {
		t.Errorf("sessions %#x, %#x for the 2s and 2.5s locks (primary %#x): want one session, not the primary", h2.SessionID(), h25.SessionID(), primary)
	}
	if hDay.SessionID() != primary {
		t.Errorf("the 24h lock is in session %#x, want the primary %#x (its grant, 10s, is the server's ceiling)", hDay.SessionID(), primary)
	}
	if got := sessionsOn(t, srv.Addr()); len(got) != 2 || !got[h2.SessionID()] {
		t.Fatalf("sessions on the server with locks of 2s and 10s: %v, want two", got)
	}
	// Held across more than two idle checks (10s each), the session stays.
	time.Sleep(21 * time.Second)
	if h2.Err() != nil || !sessionsOn(t, srv.Addr())[h2.SessionID()] {
		t.Fatalf("the 2s session was closed while its lock was held: Err() = %v", h2.Err())
	}
	for _, h := range []*zookeeper.Handle{h2, h25, hDay} {
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	released := time.Now()
	for {
		got := sessionsOn(t, srv.Addr())
		if len(got) == 1 && got[primary] {
			t.Logf("the idle 2s session was closed %v after its last lock was released", time.Since(released).Round(time.Millisecond))
			break
		}
		if time.Since(released) > 25*time.Second {
			t.Fatalf("sessions on the server %v after the last lock of the 2s session was released: want the primary one only (idle sessions close within 20s)", time.Since(released).Round(time.Second))
		}
		time.Sleep(500 * time.Millisecond) // the server only answers when asked
	}
	// And it is dialed again when needed.
	h := take(k+"/again", 2*time.Second)
	if h.TTL() != 2*time.Second || h.SessionID() == primary {
		t.Errorf("after the idle close: lease %v in session %#x, want 2s in a new session", h.TTL(), h.SessionID())
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// New on your connection: its session serves the TTLs at or above its
// timeout (the default TTL included); a shorter TTL needs a session New
// can dial only with WithServers, and without it is refused with an error
// naming WithServers, never given a longer lease.
func TestNewLeases(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	ctx := ctxFor(t, time.Minute)
	k := testKey(t)
	for _, withServers := range []bool{false, true} {
		conn, events := plainConn(t, srv.Addr())
		opts := []zookeeper.Option{zookeeper.WithSessionTimeout(sessionTimeout)}
		if withServers {
			opts = append(opts, zookeeper.WithServers(srv.Addr()))
		}
		l := zookeeper.New(conn, events, opts...)
		t.Cleanup(func() { _ = l.Close() })
		name := fmt.Sprintf("New (WithServers: %v)", withServers)

		// The default TTL, 30s, and WithTTL(3s): your session (3s), or,
		// with servers, a session of its own for the 30s.
		hd, err := l.TryAcquire(ctx, fmt.Sprintf("%s/%v/default", k, withServers))
		if err != nil {
			t.Fatalf("%s: TryAcquire without WithTTL: %v", name, err)
		}
		want, wantOwn := sessionTimeout, true
		if withServers {
			want, wantOwn = 10*time.Second, false // 30s asked, the server's ceiling granted
		}
		if hd.TTL() != want || (hd.(*zookeeper.Handle).SessionID() == conn.SessionID()) != wantOwn {
			t.Errorf("%s: default TTL: lease %v in session %#x (yours %#x), want %v in yours: %v", name, hd.TTL(), hd.(*zookeeper.Handle).SessionID(), conn.SessionID(), want, wantOwn)
		}
		h3, err := l.TryAcquire(ctx, fmt.Sprintf("%s/%v/3s", k, withServers), locker.WithTTL(sessionTimeout))
		if err != nil {
			t.Fatalf("%s: TryAcquire with WithTTL(%v): %v", name, sessionTimeout, err)
		}
		if h3.TTL() != sessionTimeout || h3.(*zookeeper.Handle).SessionID() != conn.SessionID() {
			t.Errorf("%s: WithTTL(%v): lease %v in session %#x, want %v in yours (%#x)", name, sessionTimeout, h3.TTL(), h3.(*zookeeper.Handle).SessionID(), sessionTimeout, conn.SessionID())
		}
		// Shorter than your session: only with servers.
		h1, err := l.TryAcquire(ctx, fmt.Sprintf("%s/%v/1s", k, withServers), locker.WithTTL(time.Second))
		switch {
		case withServers && err != nil:
			t.Errorf("%s: TryAcquire with WithTTL(1s): %v", name, err)
		case withServers && (h1.TTL() != time.Second || h1.(*zookeeper.Handle).SessionID() == conn.SessionID()):
			t.Errorf("%s: WithTTL(1s): lease %v in session %#x, want 1s in a session of its own", name, h1.TTL(), h1.(*zookeeper.Handle).SessionID())
		case !withServers && err == nil:
			t.Errorf("%s: WithTTL(1s) taken with lease %v: a TTL below your session's timeout needs a session New cannot dial without WithServers", name, h1.TTL())
		case !withServers && (!errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), "WithServers")):
			t.Errorf("%s: WithTTL(1s): %v, want an error wrapping ErrInvalidOption that names WithServers", name, err)
		}
		for _, h := range []locker.Handle{hd, h3, h1} {
			if h != nil {
				if err := h.Release(ctx); err != nil {
					t.Errorf("%s: Release: %v", name, err)
				}
			}
		}
	}
}

// The granted timeout governs every session, not only the first: on a
// server whose maxSessionTimeout is 1.6s, a Locker whose primary session
// is of 1s takes a lock with WithTTL(10s) in a second session, asked for
// 10s and granted 1.6s. The lock reports 1.6s, and once its holder is cut
// off, it reports the loss before the key goes to another client, within
// about 1.6s (it would take the asked 10s if that session's deadlines
// came from the timeout asked).
func TestGrantedCeilingOnSecondSession(t *testing.T) {
	srv := shortSessionServer(t)
	a, b := newClient(t, srv.Addr(), zookeeper.WithDefaultTTL(time.Second)), newClient(t, srv.Addr())
	ctx := ctxFor(t, time.Minute)
	if st := a.l.SessionTimeout(); st != time.Second {
		t.Fatalf("primary session timeout %v, want the 1s asked", st)
	}
	r := cutHolderWithTTL(t, ctx, a, b, testKey(t), askedLong, time.Second)
	if r.lease != maxGranted {
		t.Errorf("Handle.TTL() = %v for WithTTL(%v) on a server with maxSessionTimeout=%v, want the ceiling %v", r.lease, askedLong, maxGranted, maxGranted)
	}
	t.Logf("lease %v in a second session: loss reported %v after the cut, key taken by another client %v after it",
		r.lease, r.lost.Round(time.Millisecond), r.got.Round(time.Millisecond))
}
