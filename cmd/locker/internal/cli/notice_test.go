package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/memlock"
)

// lineWriter hands each write to a channel.
type lineWriter chan string

func (w lineWriter) Write(p []byte) (int, error) { w <- string(p); return len(p), nil }

// TestWaitNotice: a run that waits longer than waitNoticeAfter says who
// holds the lock (memlock can tell), once; a run whose wait ended first, a
// --quiet run and a short --wait say nothing.
func TestWaitNotice(t *testing.T) {
	old := waitNoticeAfter
	waitNoticeAfter = 20 * time.Millisecond
	t.Cleanup(func() { waitNoticeAfter = old })
	s := memlock.NewStore()
	holder, waiter := s.NewLocker(), s.NewLocker()
	defer holder.Close()
	defer waiter.Close()
	h, err := holder.Acquire(t.Context(), "k", locker.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release(context.Background())

	out := make(lineWriter, 4)
	stop := waitNotice(t.Context(), out, waiter, "k", lockOpts{wait: waitFlag{forever: true}})
	select {
	case msg := <-out:
		want := fmt.Sprintf("still waiting for the lock on %q after 20ms: held by another holder (token %d", "k", h.Token())
		if !strings.Contains(msg, want) {
			t.Errorf("notice %q does not say %q", msg, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notice within 10s of a 20ms wait")
	}
	stop()
	select {
	case msg := <-out:
		t.Errorf("a second notice: %q", msg)
	default:
	}

	for _, o := range []lockOpts{
		{wait: waitFlag{forever: true}, quiet: true},
		{wait: waitFlag{d: 10 * time.Millisecond}},
	} {
		stop := waitNotice(t.Context(), out, waiter, "k", o)
		time.Sleep(100 * time.Millisecond) // five notice delays: a notice would have come
		stop()
		select {
		case msg := <-out:
			t.Errorf("notice with %+v: %q", o, msg)
		default:
		}
	}
}
