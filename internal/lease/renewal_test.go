package lease

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The tests drive leases with short TTLs and wait for the callbacks through
// channels; the only timing they assert is the one the package promises:
// no loss before the deadline, and a loss report once it has passed.

const ttl = 150 * time.Millisecond

func lostChan() (func(error), chan error) {
	ch := make(chan error, 2)
	return func(err error) { ch <- err }, ch
}

func waitLost(t *testing.T, ch chan error, within time.Duration) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(within):
		t.Fatalf("Lost not called within %v", within)
		return nil
	}
}

func TestRenewKeepsLease(t *testing.T) {
	lost, lostCh := lostChan()
	renewed := make(chan time.Time, 100)
	start := time.Now()
	l := StartRenewal(start, RenewConfig{TTL: ttl, Drift: 10 * time.Millisecond, Lost: lost,
		Renew: func(ctx context.Context) (bool, error) {
			if _, ok := ctx.Deadline(); !ok {
				t.Error("renewal ctx has no deadline")
			}
			renewed <- time.Now()
			return true, nil
		}})
	defer l.Stop()
	// Renewals keep coming, each about TTL/3 after the last: six of them
	// span two TTLs, and the lease must survive them all.
	var last time.Time
	for i := range 6 {
		select {
		case last = <-renewed:
		case err := <-lostCh:
			t.Fatalf("lost after %d renewals: %v", i, err)
		case <-time.After(5 * ttl):
			t.Fatalf("renewal %d did not come", i)
		}
	}
	if last.Sub(start) < 6*ttl/3-10*time.Millisecond {
		t.Errorf("six renewals within %v: more often than every TTL/3", last.Sub(start))
	}
	if d := l.Deadline(); !d.After(start.Add(ttl)) {
		t.Errorf("deadline %v not moved past the first lease", d.Sub(start))
	}
	select {
	case err := <-lostCh:
		t.Fatalf("lost: %v", err)
	default:
	}
	if !l.Stop() {
		t.Error("Stop of a kept lease returned false")
	}
	if l.Stop() {
		t.Error("second Stop returned true")
	}
}

func TestRenewGone(t *testing.T) {
	lost, lostCh := lostChan()
	l := StartRenewal(time.Now(), RenewConfig{TTL: ttl, Lost: lost,
		Renew: func(context.Context) (bool, error) { return false, nil }})
	if err := waitLost(t, lostCh, 2*ttl); !errors.Is(err, ErrGone) {
		t.Fatalf("cause %v, want ErrGone", err)
	}
	if l.Stop() {
		t.Error("Stop after loss returned true")
	}
	select {
	case err := <-lostCh:
		t.Fatalf("Lost called twice; second: %v", err)
	case <-time.After(ttl):
	}
}

func TestRenewHangsUntilDeadline(t *testing.T) {
	lost, lostCh := lostChan()
	var ctxEnded atomic.Bool
	start := time.Now()
	drift := 20 * time.Millisecond
	StartRenewal(start, RenewConfig{TTL: ttl, Drift: drift, Lost: lost,
		Renew: func(ctx context.Context) (bool, error) {
			<-ctx.Done() // a partition: no reply
			ctxEnded.Store(true)
			return false, ctx.Err()
		}})
	err := waitLost(t, lostCh, 3*ttl)
	at := time.Since(start)
	if !errors.Is(err, ErrExpired) {
		t.Fatalf("cause %v, want ErrExpired", err)
	}
	if at < ttl-drift {
		t.Errorf("lost after %v, before the deadline %v", at, ttl-drift)
	}
}

// TestLossSaysARenewalHangs: the loss of a lock whose renewal never
// answered (a server or a pool that holds the request, past its context)
// says so, with how long it has been waiting, so that a loss under load
// tells a hung renewal from failing ones and from a starved timer.
func TestLossSaysARenewalHangs(t *testing.T) {
	lost, lostCh := lostChan()
	unblock := make(chan struct{})
	defer close(unblock)
	// The renewal is due at once and the lease lasts a second: on a
	// loaded machine the renewal timer still runs well before the loss's.
	const long = time.Second
	StartRenewal(time.Now(), RenewConfig{TTL: long, Interval: time.Millisecond, Lost: lost,
		Renew: func(context.Context) (bool, error) {
			<-unblock // deaf to its context: still in flight at the deadline
			return true, nil
		}})
	err := waitLost(t, lostCh, 3*long)
	if msg := err.Error(); !errors.Is(err, ErrExpired) || !strings.Contains(msg, "(1 sent); a renewal sent ") || !strings.Contains(msg, "ago has not answered") {
		t.Fatalf("cause %q: want ErrExpired saying one renewal was sent and has not answered", msg)
	}
}

func TestRenewTransientErrorsThenLoss(t *testing.T) {
	lost, lostCh := lostChan()
	var calls atomic.Int32
	boom := errors.New("connection refused")
	StartRenewal(time.Now(), RenewConfig{TTL: ttl, Lost: lost, Retry: 10 * time.Millisecond,
		Renew: func(context.Context) (bool, error) {
			calls.Add(1)
			return false, boom
		}})
	err := waitLost(t, lostCh, 3*ttl)
	if !errors.Is(err, ErrExpired) || !errors.Is(err, boom) {
		t.Fatalf("cause %v, want ErrExpired wrapping the last renewal error", err)
	}
	if !regexp.MustCompile(`\(([3-9]|\d\d+) sent\)`).MatchString(err.Error()) {
		t.Errorf("cause %q: want the number of renewals sent since the last success (3 or more)", err)
	}
	// First renewal at TTL/3, then every 10ms until the deadline at TTL:
	// several retries, not one.
	if n := calls.Load(); n < 3 {
		t.Errorf("%d renewal attempts before the loss, want retries after each failure", n)
	}
}

func TestRenewRecoversAfterTransientError(t *testing.T) {
	lost, lostCh := lostChan()
	var calls atomic.Int32
	ok := make(chan struct{}, 100)
	l := StartRenewal(time.Now(), RenewConfig{TTL: ttl, Lost: lost, Retry: 5 * time.Millisecond,
		Renew: func(context.Context) (bool, error) {
			if calls.Add(1) == 1 {
				return false, errors.New("failover")
			}
			ok <- struct{}{}
			return true, nil
		}})
	defer l.Stop()
	for range 4 {
		select {
		case <-ok:
		case err := <-lostCh:
			t.Fatalf("lost: %v", err)
		case <-time.After(5 * ttl):
			t.Fatal("no successful renewal")
		}
	}
}

func TestExtendedWithoutRenew(t *testing.T) {
	lost, lostCh := lostChan()
	start := time.Now()
	l := StartRenewal(start, RenewConfig{TTL: ttl, Lost: lost})
	// Extend from outside (a keep-alive response) for two TTLs.
	var lastExt time.Time
	for time.Since(start) < 2*ttl {
		lastExt = time.Now()
		l.Extended(lastExt)
		select {
		case err := <-lostCh:
			t.Fatalf("lost while extended: %v", err)
		case <-time.After(ttl / 5):
		}
	}
	err := waitLost(t, lostCh, 3*ttl)
	if !errors.Is(err, ErrExpired) {
		t.Fatalf("cause %v, want ErrExpired", err)
	}
	if since := time.Since(lastExt); since < ttl {
		t.Errorf("lost %v after the last extension, before its deadline", since)
	}
}

func TestStopCancelsInflightRenewal(t *testing.T) {
	lost, lostCh := lostChan()
	entered := make(chan struct{})
	cancelled := make(chan struct{})
	l := StartRenewal(time.Now(), RenewConfig{TTL: time.Minute, Interval: time.Millisecond, Lost: lost,
		Renew: func(ctx context.Context) (bool, error) {
			close(entered)
			<-ctx.Done()
			close(cancelled)
			return false, ctx.Err()
		}})
	<-entered
	if !l.Stop() {
		t.Fatal("Stop returned false")
	}
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not cancel the renewal in flight")
	}
	select {
	case err := <-lostCh:
		t.Fatalf("Lost after Stop: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
}

func TestGoRefusedWhenClosing(t *testing.T) {
	lost, lostCh := lostChan()
	var renews, refused atomic.Int32
	refusedCh := make(chan struct{}, 10)
	StartRenewal(time.Now(), RenewConfig{TTL: ttl, Lost: lost,
		Renew: func(context.Context) (bool, error) { renews.Add(1); return true, nil },
		Go: func(func()) bool {
			refused.Add(1)
			refusedCh <- struct{}{}
			return false
		}})
	// Both the renewal and the loss check are refused: the owner is closing
	// and ends the lock itself.
	for range 2 {
		select {
		case <-refusedCh:
		case <-time.After(3 * ttl):
			t.Fatal("Go not asked")
		}
	}
	select {
	case err := <-lostCh:
		t.Fatalf("Lost ran though Go refused: %v", err)
	case <-time.After(ttl / 2):
	}
	if renews.Load() != 0 {
		t.Errorf("%d renewals ran though Go refused", renews.Load())
	}
}

func TestStartRejectsBadConfig(t *testing.T) {
	for _, c := range []RenewConfig{
		{TTL: 0, Lost: func(error) {}},
		{TTL: time.Second, Drift: time.Second, Lost: func(error) {}},
		{TTL: time.Second, Drift: -1, Lost: func(error) {}},
		{TTL: time.Second},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Start(%+v) did not panic", c)
				}
			}()
			StartRenewal(time.Now(), c)
		}()
	}
}

// Expired goes by the deadline alone, whether or not Lost has run yet.
func TestExpired(t *testing.T) {
	sent := time.Now()
	l := StartRenewal(sent, RenewConfig{TTL: time.Hour, Drift: time.Minute, Lost: func(error) {}})
	defer l.Stop()
	if l.Expired(sent) {
		t.Fatal("Expired at the send time of the acquisition")
	}
	if !l.Expired(sent.Add(time.Hour - time.Minute)) {
		t.Fatal("not Expired at sent + TTL - Drift")
	}
	if l.Expired(sent.Add(time.Hour - time.Minute - time.Millisecond)) {
		t.Fatal("Expired before the deadline")
	}
}

// TestCheckDeclaresLossAtOnce: once the deadline has passed, Check returns
// only after Lost has been called, whether Check or the loss timer (due at
// the same moment, as after a pause) declared it; before the deadline it
// does nothing.
func TestCheckDeclaresLossAtOnce(t *testing.T) {
	for i := range 200 {
		var calls atomic.Int32
		var done atomic.Bool
		l := StartRenewal(time.Now().Add(-2*time.Hour), RenewConfig{TTL: time.Hour, Drift: time.Minute, Lost: func(error) {
			calls.Add(1)
			done.Store(true)
		}})
		l.Check()
		if !done.Load() {
			t.Fatalf("round %d: Check returned on a lease past its deadline before Lost was called", i)
		}
		l.Check()
		if n := calls.Load(); n != 1 {
			t.Fatalf("round %d: Lost called %d times, want once", i, n)
		}
	}
	var called atomic.Bool
	l := StartRenewal(time.Now(), RenewConfig{TTL: time.Hour, Drift: time.Minute, Lost: func(error) { called.Store(true) }})
	defer l.Stop()
	l.Check()
	if called.Load() {
		t.Fatal("Check declared the loss of a lease whose deadline is an hour away")
	}
}

// TestSlotBeforeSet: a Slot whose lease has not started yet does nothing
// and reports nothing expired; once set, it forwards to the Lease.
func TestSlotBeforeSet(t *testing.T) {
	var s Slot
	s.Check()
	s.Stop()
	if s.Expired(time.Now().Add(time.Hour)) || s.Get() != nil {
		t.Fatal("an empty Slot reports a lease")
	}
	var lost atomic.Bool
	s.Set(StartRenewal(time.Now().Add(-2*time.Hour), RenewConfig{TTL: time.Hour, Drift: time.Minute, Lost: func(error) { lost.Store(true) }}))
	if !s.Expired(time.Now()) {
		t.Fatal("a Slot holding a lease past its deadline does not report it expired")
	}
	s.Check()
	if !lost.Load() {
		t.Fatal("Slot.Check did not declare the loss of a lease past its deadline")
	}
}
