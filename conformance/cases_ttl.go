package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// The TTL cases check the one TTL contract (see locker.MinTTL): every TTL of
// the portable range works, one default for all, the lease given is the TTL
// asked or the nearest safe one, it is reported (Handle.TTL, LockInfo.Lease),
// and a silent holder's lock does not outlive the lease reported.

// leaseFor is the lease the backend must give, and report, for a TTL asked:
// the TTL itself, unless the harness declares what the server imposes
// (Harness.LeaseGrain, LeaseCeiling, LeaseFloor).
func (s *suite) leaseFor(asked time.Duration) time.Duration {
	want := asked
	if g := s.h.LeaseGrain; g > 0 {
		want = want.Truncate(g)
	}
	if c := s.h.LeaseCeiling; c > 0 {
		want = min(want, c)
	}
	if f := s.h.LeaseFloor; f > 0 {
		want = max(want, f)
	}
	return want
}

// checkLease checks what h reports of its lease, asked for with what (a
// description of the TTL asked), against want; and, where the Locker in is
// an Inspector, what Inspect reports of it.
func (s *suite) checkLease(t *testing.T, ctx context.Context, in locker.Locker, h locker.Handle, what string, want time.Duration) {
	t.Helper()
	got := h.TTL()
	switch {
	case got <= 0:
		t.Errorf("Handle.TTL() of a lock taken with %s = %v, want the positive lease the backend gave", what, got)
	case got != want:
		t.Errorf("Handle.TTL() of a lock taken with %s = %v, want %v: the TTL asked, or the nearest safe lease (rounded down to the server's unit, its ceiling, or its floor: Harness.LeaseGrain %v, LeaseCeiling %v, LeaseFloor %v)",
			what, got, want, s.h.LeaseGrain, s.h.LeaseCeiling, s.h.LeaseFloor)
	}
	insp, ok := in.(locker.Inspector)
	if !ok {
		return
	}
	info := mustInspect(t, ctx, insp, h.Key())
	if !info.Held || info.Token != h.Token() {
		t.Errorf("Inspect of a lock taken with %s (token %d): %+v, want it held with that token", what, h.Token(), info)
		return
	}
	switch {
	case s.h.NoInspectLease != "" && info.Lease != 0:
		t.Errorf("Inspect of a lock taken with %s: Lease %v, want 0: Harness.NoInspectLease says the backend cannot tell (%s)", what, info.Lease, s.h.NoInspectLease)
	case s.h.NoInspectLease == "" && info.Lease != got:
		t.Errorf("Inspect of a lock taken with %s: Lease %v, want the holder's Handle.TTL() %v (or set Harness.NoInspectLease, if the backend cannot tell)", what, info.Lease, got)
	}
	if info.TTL < 0 || info.TTL > got {
		t.Errorf("Inspect of a lock taken with %s: TTL (remaining) %v, want between 0 and the lease %v", what, info.TTL, got)
	}
}

// ttlRange: every TTL of the portable range is accepted, the shortest, the
// longest and one between that no server unit divides (1.5×MinTTL), and
// each lock reports the lease the rule predicts.
func (s *suite) ttlRange(t *testing.T, ctx context.Context) {
	a, b := s.newLocker(t), s.newLocker(t)
	for i, asked := range []time.Duration{locker.MinTTL, locker.MinTTL + locker.MinTTL/2, locker.MaxTTL} {
		k := key(t, "/"+itoa(i))
		h, err := a.TryAcquire(ctx, k, locker.WithTTL(asked))
		if err != nil {
			t.Errorf("TryAcquire with WithTTL(%v), in the portable range [%v, %v]: %v, want success on every backend", asked, locker.MinTTL, locker.MaxTTL, err)
			continue
		}
		checkHeld(t, h, k)
		s.checkLease(t, ctx, b, h, "WithTTL("+asked.String()+")", s.leaseFor(asked))
		mustNotTry(t, ctx, b, k, "it is held with WithTTL("+asked.String()+")")
		mustRelease(t, ctx, h)
	}
}

// ttlDefault: a lock taken without WithTTL has the one default,
// locker.DefaultTTL: it reports the same lease as a lock taken with
// WithTTL(locker.DefaultTTL).
func (s *suite) ttlDefault(t *testing.T, ctx context.Context) {
	a, b := s.newLocker(t), s.newLocker(t)
	hd, err := a.TryAcquire(ctx, key(t, "/default"))
	if err != nil {
		t.Fatalf("TryAcquire without WithTTL: %v", err)
	}
	he, err := a.TryAcquire(ctx, key(t, "/explicit"), locker.WithTTL(locker.DefaultTTL))
	if err != nil {
		t.Fatalf("TryAcquire with WithTTL(locker.DefaultTTL): %v", err)
	}
	if hd.TTL() != he.TTL() {
		t.Errorf("a lock taken without WithTTL has the lease %v, one taken with WithTTL(locker.DefaultTTL = %v) %v: the default TTL must be locker.DefaultTTL on every backend",
			hd.TTL(), locker.DefaultTTL, he.TTL())
	}
	s.checkLease(t, ctx, b, hd, "no WithTTL", s.leaseFor(locker.DefaultTTL))
	s.checkLease(t, ctx, b, he, "WithTTL(locker.DefaultTTL)", s.leaseFor(locker.DefaultTTL))
	mustRelease(t, ctx, hd)
	mustRelease(t, ctx, he)
}

// ttlSilentHolder: a holder that goes silent (cut off from the backend, or,
// without Harness.Cut, crashed) keeps the key from others for no longer
// than the lease its Handle reported, plus Harness.ExpirySlack: the TTL is
// the longest a lock outlives a silent holder, on every backend.
func (s *suite) ttlSilentHolder(t *testing.T, ctx context.Context) {
	if s.h.Cut == nil && s.h.Crash == nil {
		t.Skip("conformance: neither Harness.Cut nor Harness.Crash is set; set one to check how long a silent holder's lock lasts")
	}
	a, b := s.newLocker(t), s.newLocker(t)
	k := key(t, "")
	ha := mustAcquire(t, ctx, a, k, ttl(s))
	lease := ha.TTL()
	s.checkLease(t, ctx, b, ha, "WithTTL("+s.h.TTL.String()+")", s.leaseFor(s.h.TTL))
	how := "crashed"
	if s.h.Cut != nil {
		heal := s.cut(t, a)
		defer heal()
		how = "was cut off"
	} else {
		s.h.Crash(t, a)
	}
	silent := time.Now()
	bound := lease + s.h.ExpirySlack
	actx, cancel := context.WithTimeout(ctx, bound+prompt)
	defer cancel()
	hb, err := b.Acquire(actx, k)
	took := time.Since(silent)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the key of a holder that %s was still held %v later: its lock outlived the lease %v it reported by more than Harness.ExpirySlack %v", how, took, lease, s.h.ExpirySlack)
		}
		t.Fatalf("Acquire after the holder %s: %v", how, err)
	}
	t.Logf("key acquirable %v after its holder %s (reported lease %v, slack %v)", took, how, lease, s.h.ExpirySlack)
	if took > bound {
		t.Errorf("key acquirable only %v after its holder %s: its lock outlived the lease %v it reported by more than Harness.ExpirySlack %v", took, how, lease, s.h.ExpirySlack)
	}
	if hb.Token() <= ha.Token() {
		t.Errorf("token %d after the holder %s is not greater than its %d", hb.Token(), how, ha.Token())
	}
	mustRelease(t, ctx, hb)
}
