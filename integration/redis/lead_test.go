package redis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
)

// TestLeadLeaderCutOff: locker.Lead on a real Redis, two candidates, each
// through its own proxy. The leader is cut off (its renewals hang): its
// work's context must be cancelled, with a cause wrapping ErrLost, before
// the other candidate's work starts, and the new term's token is higher.
// Once healed, the deposed candidate campaigns again and waits its turn.
func TestLeadLeaderCutOff(t *testing.T) {
	srv := testserver.Redis(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const ttl = time.Second
	key := uniqueKey(t)

	type term struct {
		who        int
		token      int64
		start, end time.Time
		cause      error
	}
	starts := make(chan term, 8)
	ends := make(chan term, 8)
	var proxies [2]*testserver.Proxy
	done := make(chan error, 2)
	for i := range 2 {
		proxies[i] = testserver.NewProxy(t, srv.Addr())
		l := newTestLocker(t, proxies[i].Addr())
		go func() {
			done <- locker.Lead(ctx, l, key, func(wctx context.Context, h locker.Handle) error {
				tm := term{who: i, token: h.Token(), start: time.Now()}
				starts <- tm
				<-wctx.Done()
				tm.end, tm.cause = time.Now(), context.Cause(wctx)
				ends <- tm
				return wctx.Err()
			}, locker.WithTTL(ttl))
		}()
	}

	first := <-starts
	proxies[first.who].Partition(t)
	cut := time.Now()
	var firstEnd, second term
	for got := 0; got < 2; got++ {
		select {
		case e := <-ends:
			if e.who != first.who || e.token != first.token {
				t.Fatalf("term %+v ended, not the cut-off leader's", e)
			}
			firstEnd = e
		case s := <-starts:
			second = s
		case <-ctx.Done():
			t.Fatal("the cut-off leader's work was not stopped, or no new leader took over, within a minute")
		}
	}
	t.Logf("cut → old leader's ctx cancelled %v, cut → new leader's work starts %v", firstEnd.end.Sub(cut), second.start.Sub(cut))
	if second.who == first.who {
		t.Fatalf("the cut-off candidate %d led again while cut off", first.who)
	}
	if !firstEnd.end.Before(second.start) {
		t.Errorf("the new leader's work started %v before the cut-off leader's context was cancelled", firstEnd.end.Sub(second.start))
	}
	if !errors.Is(firstEnd.cause, locker.ErrLost) {
		t.Errorf("the old leader's context cause = %v, want an error wrapping ErrLost", firstEnd.cause)
	}
	if second.token <= first.token {
		t.Errorf("new leader's token %d not above the old leader's %d", second.token, first.token)
	}

	// Healed, the deposed candidate campaigns again but does not lead while
	// the other does.
	proxies[first.who].Heal(t)
	select {
	case s := <-starts:
		t.Fatalf("candidate %d started a term (token %d) while candidate %d led", s.who, s.token, second.who)
	case <-time.After(3 * ttl):
	}
	cancel()
	for range 2 {
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Lead after its ctx was cancelled = %v, want an error wrapping context.Canceled", err)
		}
	}
}
