package backend

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

var errCause = errors.New("the caller gave up")

func TestEnterRefuses(t *testing.T) {
	cfgErr := errors.New("bad option")
	if _, _, err := NewLife[int](cfgErr).Enter(context.Background(), "acquire", "k"); !errors.Is(err, cfgErr) {
		t.Errorf("Enter with a config error = %v", err)
	}
	l := NewLife[int](nil)
	if _, _, err := l.Enter(context.Background(), "acquire", ""); !errors.Is(err, locker.ErrInvalidKey) {
		t.Errorf("Enter of an empty key = %v", err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errCause)
	_, _, err := l.Enter(ctx, "acquire", "k")
	if !errors.Is(err, context.Canceled) || !errors.Is(err, errCause) {
		t.Errorf("Enter with a cancelled context = %v, want context.Canceled and its cause", err)
	}
	if err := l.Close(Closer[int]{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Enter(context.Background(), "acquire", "k"); !errors.Is(err, locker.ErrClosed) {
		t.Errorf("Enter after Close = %v", err)
	}
	if l.Go(func() {}) || l.Run(func() {}) || l.Begin() {
		t.Error("Go or Run ran after Close")
	}
	if l.Active() != 0 {
		t.Errorf("Active() = %d after refused calls", l.Active())
	}
}

func TestWhy(t *testing.T) {
	l := NewLife[int](nil)
	parent, cancel := context.WithCancelCause(context.Background())
	ctx, done, err := l.Enter(parent, "acquire", "k")
	if err != nil {
		t.Fatal(err)
	}
	other := errors.New("other")
	if got := l.Why(ctx, other); got != other {
		t.Errorf("Why before the end = %v", got)
	}
	cancel(errCause)
	if got := l.Why(ctx, other); !errors.Is(got, context.Canceled) || !errors.Is(got, errCause) {
		t.Errorf("Why after the caller's cancel = %v", got)
	}
	done()

	ctx, done, err = l.Enter(context.Background(), "acquire", "k")
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan error)
	go func() { closed <- l.Close(Closer[int]{Grace: time.Minute}) }()
	<-ctx.Done()
	if got := l.Why(ctx, other); !errors.Is(got, locker.ErrClosed) || errors.Is(got, context.Canceled) {
		t.Errorf("Why after Close = %v, want locker.ErrClosed only", got)
	}
	select {
	case <-closed:
		t.Fatal("Close returned while a call was in progress and the grace not over")
	case <-time.After(20 * time.Millisecond):
	}
	done()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

func TestCloseReleasesHeldAndWaits(t *testing.T) {
	l := NewLife[int](nil)
	for i := range 3 {
		if !l.Hold(i) {
			t.Fatal("Hold before Close = false")
		}
	}
	l.Drop(1)
	release := make(chan struct{})
	if !l.Go(func() { <-release }) {
		t.Fatal("Go before Close = false")
	}
	var got []int
	var order []string
	errShut := errors.New("shut")
	go func() { <-l.Abandoned().Done(); close(release) }()
	err := l.Close(Closer[int]{
		Release: func(held []int) error {
			got = held
			order = append(order, "release")
			if l.Hold(9) {
				t.Error("Hold during Close = true")
			}
			if !l.Go(func() {}) {
				t.Error("Go during Close (before the grace is over) = false")
			}
			return nil
		},
		Grace:    10 * time.Millisecond,
		Shutdown: func() error { order = append(order, "shutdown"); return errShut },
		Wait:     true,
	})
	if !errors.Is(err, errShut) {
		t.Errorf("Close = %v, want Shutdown's error", err)
	}
	if len(got) != 2 || len(order) != 2 || order[0] != "release" {
		t.Errorf("Release got %v, steps %v", got, order)
	}
	if l.Active() != 0 {
		t.Errorf("Active() = %d after Close with Wait", l.Active())
	}
	if err := l.Close(Closer[int]{}); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

func TestSecondCloseWaitsForFirst(t *testing.T) {
	l := NewLife[int](nil)
	l.Hold(1)
	inRelease, finish := make(chan struct{}), make(chan struct{})
	first := make(chan error)
	go func() {
		first <- l.Close(Closer[int]{Release: func([]int) error { close(inRelease); <-finish; return nil }})
	}()
	<-inRelease
	second := make(chan error)
	go func() { second <- l.Close(Closer[int]{}) }()
	select {
	case err := <-second:
		t.Fatalf("second Close returned (%v) while the first was still releasing", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(finish)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
}

type testHandle struct{ locker.Handle }

func TestAsHandleNeverTypedNil(t *testing.T) {
	var typed *testHandle
	if h, err := AsHandle(typed, errCause); h != nil || err != errCause {
		t.Errorf("AsHandle(typed nil, err) = %v, %v; want a nil interface and err", h, err)
	}
	want := &testHandle{}
	if h, err := AsHandle(want, nil); h != locker.Handle(want) || err != nil {
		t.Errorf("AsHandle(h, nil) = %v, %v", h, err)
	}
}

// TestCloseEndsEveryCallInProgress: calls that ended before Close, in any
// order, are forgotten; each call still in progress when Close begins
// sees its context end with locker.ErrClosed, and Close waits for it.
func TestCloseEndsEveryCallInProgress(t *testing.T) {
	l := NewLife[int](nil)
	type call struct {
		ctx  context.Context
		done func()
	}
	var calls []call
	for range 8 {
		ctx, done, err := l.Enter(context.Background(), "acquire", "k")
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, call{ctx, done})
	}
	// End the first, the last and two in the middle, out of order.
	ended := map[int]bool{7: true, 0: true, 3: true, 4: true}
	for _, i := range []int{7, 0, 3, 4} {
		calls[i].done()
		if got := context.Cause(calls[i].ctx); !errors.Is(got, context.Canceled) {
			t.Errorf("call %d: cause %v after done, want context.Canceled", i, got)
		}
	}
	if got := l.Active(); got != 4 {
		t.Fatalf("Active() = %d, want 4", got)
	}
	if got := listed(l); got != 4 {
		t.Fatalf("%d calls listed for Close, want the 4 in progress", got)
	}
	closed := make(chan error, 1)
	go func() { closed <- l.Close(Closer[int]{Grace: time.Minute}) }()
	for i, c := range calls {
		if ended[i] {
			continue
		}
		<-c.ctx.Done()
		if got := context.Cause(c.ctx); !errors.Is(got, locker.ErrClosed) {
			t.Errorf("call %d: cause %v after Close, want locker.ErrClosed", i, got)
		}
	}
	for i, c := range calls {
		if !ended[i] {
			c.done()
		}
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if got := l.Active(); got != 0 {
		t.Errorf("Active() = %d after Close", got)
	}
	if got := listed(l); got != 0 {
		t.Errorf("%d calls still listed after they ended", got)
	}
}

// listed counts the calls in l's list for Close, checking its back links.
func listed(l *Life[int]) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	var prev *entered[int]
	for e := l.calls; e != nil; e = e.next {
		if e.prev != prev {
			return -1
		}
		prev = e
		n++
	}
	return n
}
