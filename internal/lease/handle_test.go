package lease

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// fake is a backend's protocol as a Handle sees it: what its release
// answers, and what the Handle asked of it.
type fake struct {
	ours      bool
	err       error
	admitted  bool
	cleanups  atomic.Int32
	forgotten atomic.Int32
	entered   atomic.Int32
	exited    atomic.Int32
	released  atomic.Int32
	// renew answers the watchdog's renewals (Start with watchdog true).
	renew func(context.Context) (bool, error)
}

func (f *fake) Release(context.Context) (bool, error) { f.released.Add(1); return f.ours, f.err }
func (f *fake) Cleanup() bool                         { f.cleanups.Add(1); return true }
func (f *fake) Forget()                               { f.forgotten.Add(1) }
func (f *fake) Enter() (bool, func()) {
	f.entered.Add(1)
	return f.admitted, func() { f.exited.Add(1) }
}
func (f *fake) Renew(ctx context.Context) (bool, error) { return f.renew(ctx) }

func (f *fake) proto() Proto {
	return Proto{Ops: f, Server: "the server", Gone: "it was deleted on the server"}
}

// held returns a Handle of f whose lease (no watchdog) was sent at sent.
func held(f *fake, ttl time.Duration, sent time.Time) *Handle {
	h := &Handle{}
	h.Init("k", "owner", 7, ttl, backend.NewState(), f.proto())
	h.Start(sent, false, RenewConfig{Drift: ttl / 10})
	return h
}

func wants(t *testing.T, what string, err error, targets ...error) {
	t.Helper()
	for _, w := range targets {
		if !errors.Is(err, w) {
			t.Errorf("%s: %v, want it to wrap %v", what, err, w)
		}
	}
	var le *locker.Error
	if err != nil && (!errors.As(err, &le) || le.Key != "k") {
		t.Errorf("%s: %v, want a *locker.Error naming key \"k\"", what, err)
	}
}

// TestReleaseVerdicts: the four answers of Release, and what each leaves
// behind (Err, a clean-up, the Locker's record).
func TestReleaseVerdicts(t *testing.T) {
	unreachable := errors.New("connection refused")
	for _, tc := range []struct {
		name     string
		ours     bool
		err      error
		expired  bool
		want     []error // Release's error wraps these; none: nil
		wantErr  error   // Err after Release wraps this
		cleanups int32
		says     string // Release's message contains this
	}{
		{name: "ours", ours: true, wantErr: locker.ErrReleased},
		{name: "not ours", want: []error{locker.ErrLost}, wantErr: locker.ErrLost, says: "no longer ours"},
		{name: "unreachable", err: unreachable, want: []error{unreachable}, wantErr: locker.ErrReleased, cleanups: 1,
			says: "deleted in the background if the server answers, else it expires within its TTL of 1m0s"},
		{name: "unreachable after the deadline", err: unreachable, expired: true, want: []error{locker.ErrLost}, wantErr: locker.ErrLost, cleanups: 1,
			says: "lease had run out before Release came"},
		{name: "cut short by Close", err: locker.ErrClosed, want: []error{locker.ErrClosed}, wantErr: locker.ErrReleased,
			says: "it expires within its TTL of 1m0s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fake{ours: tc.ours, err: tc.err, admitted: true}
			sent := time.Now()
			h := held(f, time.Minute, sent)
			if tc.expired {
				// A lease whose loss timer has not had its turn yet: a
				// process paused past its deadline, say. Go refuses, as a
				// closing Locker's does, so the timer declares nothing.
				h = &Handle{}
				h.Init("k", "owner", 7, 100*time.Millisecond, backend.NewState(), f.proto())
				h.Start(sent.Add(-time.Second), false, RenewConfig{Drift: 10 * time.Millisecond, Go: func(func()) bool { return false }})
			}
			err := h.Release(context.Background())
			if len(tc.want) == 0 && err != nil {
				t.Fatalf("Release: %v, want nil", err)
			}
			wants(t, "Release", err, tc.want...)
			if tc.says != "" && (err == nil || !strings.Contains(err.Error(), tc.says)) {
				t.Errorf("Release: %v, want it to say %q", err, tc.says)
			}
			if !errors.Is(h.Err(), tc.wantErr) {
				t.Errorf("Err after Release: %v, want %v", h.Err(), tc.wantErr)
			}
			if n := f.cleanups.Load(); n != tc.cleanups {
				t.Errorf("%d clean-ups, want %d", n, tc.cleanups)
			}
			if f.forgotten.Load() == 0 || f.entered.Load() != 1 || f.exited.Load() != 1 {
				t.Errorf("forgotten %d times, entered %d, exited %d; want forgotten, and entered and exited once",
					f.forgotten.Load(), f.entered.Load(), f.exited.Load())
			}
			if ls := h.Lease(); ls.Stop() {
				t.Error("the lease was still kept after Release")
			}
			// Already ended: the same verdict again, with op "release".
			again := h.Release(context.Background())
			wants(t, "second Release", again, tc.wantErr)
			if f.released.Load() != 1 {
				t.Errorf("the server was asked %d times, want once", f.released.Load())
			}
		})
	}
}

// TestReleaseHandedToClose: a Release that Close began under (not
// admitted, or abandoned by Close) reports Close's verdict, and honours
// its ctx while it waits for it.
func TestReleaseHandedToClose(t *testing.T) {
	for _, tc := range []struct {
		name     string
		admitted bool
		err      error
	}{
		{"not admitted", false, nil},
		{"abandoned", true, ErrToClose},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fake{admitted: tc.admitted, err: tc.err}
			h := held(f, time.Minute, time.Now())
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			err := h.Release(ctx)
			wants(t, "Release while Close is releasing", err, context.DeadlineExceeded)
			if !strings.Contains(err.Error(), "Close releases the lock") {
				t.Errorf("Release while Close is releasing: %v, want it to say that Close releases the lock", err)
			}
			if f.forgotten.Load() != 0 {
				t.Error("the handle was forgotten: Close would not release it")
			}
			go func() { _ = h.Closed(true, nil) }() // Close's verdict comes
			wants(t, "Release after Close", h.Release(context.Background()), locker.ErrReleasedByClose)
		})
	}
}

// TestCloseVerdicts: what Close's release of a held lock leaves in Err,
// and what Close reports.
func TestCloseVerdicts(t *testing.T) {
	unreachable := errors.New("i/o timeout")
	for _, tc := range []struct {
		name    string
		ours    bool
		err     error
		wantErr []error
		closeE  []error
	}{
		{"ours", true, nil, []error{locker.ErrReleased, locker.ErrClosed}, nil},
		{"not ours", false, nil, []error{locker.ErrLost}, nil},
		{"unreachable", false, unreachable, []error{locker.ErrLost, locker.ErrClosed}, []error{unreachable}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := held(&fake{}, time.Minute, time.Now())
			err := h.Closed(tc.ours, tc.err)
			if tc.closeE == nil && err != nil {
				t.Errorf("Close's error: %v, want nil", err)
			}
			wants(t, "Close's error", err, tc.closeE...)
			if tc.err != nil && !strings.Contains(err.Error(), "expires within its TTL") {
				t.Errorf("Close's error: %v, want it to say the lock expires within its TTL", err)
			}
			for _, w := range tc.wantErr {
				if !errors.Is(h.Err(), w) {
					t.Errorf("Err after Close: %v, want it to wrap %v", h.Err(), w)
				}
			}
			if h.Lease().Stop() {
				t.Error("the lease was still kept after Close")
			}
		})
	}
}

// TestLoss: the lease's deadline passing ends the handle as lost, forgets
// it and cleans it up, once; Err says so at its first look after the
// deadline even when the loss timer has not run (it checks the deadline).
func TestLoss(t *testing.T) {
	f := &fake{admitted: true}
	h := held(f, 150*time.Millisecond, time.Now())
	if err := h.Err(); err != nil {
		t.Fatalf("Err while held: %v", err)
	}
	select {
	case <-h.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("not lost 2s after a 150ms lease")
	}
	wants(t, "Err after the deadline", h.Err(), locker.ErrLost)
	if !strings.Contains(h.Err().Error(), "the watchdog is off") {
		t.Errorf("Err after the deadline: %v, want it to say that the watchdog is off", h.Err())
	}
	var le *locker.Error
	if errors.As(h.Err(), &le); le == nil || le.Op != "hold" {
		t.Errorf("loss error %v: want op \"hold\"", h.Err())
	}
	if f.forgotten.Load() != 1 || f.cleanups.Load() != 1 {
		t.Errorf("after the loss: forgotten %d, cleaned up %d; want once each", f.forgotten.Load(), f.cleanups.Load())
	}
	wants(t, "Release after loss", h.Release(context.Background()), locker.ErrLost)
	if f.released.Load() != 0 {
		t.Error("Release after loss asked the server")
	}

	// Found gone by a renewal: the backend's words for what else removed it.
	g := &Handle{}
	gf := &fake{renew: func(context.Context) (bool, error) { return false, nil }}
	g.Init("k", "owner", 7, time.Minute, backend.NewState(), gf.proto())
	g.Start(time.Now(), true, RenewConfig{Drift: time.Second, Interval: time.Millisecond})
	select {
	case <-g.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("not lost 2s after a renewal found it gone")
	}
	if err := g.Err(); !errors.Is(err, locker.ErrLost) || !strings.Contains(err.Error(), "it was deleted on the server") {
		t.Errorf("Err after a renewal found the lock gone: %v", err)
	}
}

// TestLossWhileReleasing: a loss declared while a Release has claimed the
// lock is left to the Release, whose verdict comes from the server's
// answer: the lock was still ours, so it was released.
func TestLossWhileReleasing(t *testing.T) {
	f := &fake{ours: true, admitted: true}
	h := held(f, time.Minute, time.Now())
	if !h.Claim() {
		t.Fatal("Claim of a held lock failed")
	}
	h.Lose("lease ran out")
	if h.State.Ended() {
		t.Fatalf("the loss ended a lock a Release had claimed: %v", h.Err())
	}
	h.releasing = false // the Release that claimed it runs now
	if err := h.Release(context.Background()); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// TestStartAfterEnd: a lease started on a handle that has ended (Close
// took it over while the acquire was finishing) is stopped at once.
func TestStartAfterEnd(t *testing.T) {
	h := &Handle{}
	h.Init("k", "owner", 7, time.Minute, backend.NewState(), (&fake{}).proto())
	if !h.Claim() {
		t.Fatal("Claim failed")
	}
	_ = h.Closed(true, nil)
	h.Start(time.Now(), false, RenewConfig{Drift: time.Second})
	if h.Lease().Stop() {
		t.Error("a lease started on an ended handle was kept")
	}
}
