package lease

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// recorder is a Batcher's Send that records each request and refuses the
// items listed in gone.
type recorder struct {
	mu      sync.Mutex
	sent    [][]int
	dls     []time.Time
	gone    map[int]bool
	failed  map[int]error
	err     error
	block   chan struct{} // if set, Send waits for it
	entered chan struct{} // if set, Send signals it on entry
}

func (r *recorder) send(ctx context.Context, items []int, report func(int, Verdict)) error {
	if r.entered != nil {
		r.entered <- struct{}{}
	}
	if r.block != nil {
		<-r.block
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = append(r.sent, slices.Clone(items))
	dl, _ := ctx.Deadline()
	r.dls = append(r.dls, dl)
	if r.err != nil {
		return r.err
	}
	for i, it := range items {
		report(i, Verdict{OK: !r.gone[it] && r.failed[it] == nil, Err: r.failed[it]})
	}
	return nil
}

func (r *recorder) requests() [][]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sent)
}

// renewAll renews items 0..n-1 at once, each in its group (with a TTL of
// 6s: a window of 100ms, Gather permitting), and returns their verdicts and
// errors.
func renewAll(b *Batcher[int], n int, group func(int) uint64) ([]bool, []error) {
	return renewAllTTL(b, n, group, 6*time.Second)
}

func renewAllTTL(b *Batcher[int], n int, group func(int) uint64, ttl time.Duration) ([]bool, []error) {
	oks, errs := make([]bool, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			oks[i], errs[i] = b.Renew(context.Background(), group(i), ttl, i)
		})
	}
	wg.Wait()
	return oks, errs
}

func TestBatcherOneRequest(t *testing.T) {
	boom := errors.New("boom")
	r := &recorder{gone: map[int]bool{3: true}, failed: map[int]error{5: boom}}
	b := &Batcher[int]{Send: r.send, Gather: time.Second}
	oks, errs := renewAll(b, 10, func(int) uint64 { return 0 })
	reqs := r.requests()
	if len(reqs) != 1 || len(reqs[0]) != 10 {
		t.Fatalf("requests %v, want one of 10 renewals", reqs)
	}
	for i := range 10 {
		switch {
		case i == 5:
			if oks[i] || !errors.Is(errs[i], boom) {
				t.Errorf("item 5: ok %t, err %v; want its own error", oks[i], errs[i])
			}
		case errs[i] != nil || oks[i] != (i != 3):
			t.Errorf("item %d: ok %t, err %v; want ok %t (3 was gone)", i, oks[i], errs[i], i != 3)
		}
	}
}

func TestBatcherMaxAndGroups(t *testing.T) {
	r := &recorder{}
	b := &Batcher[int]{Send: r.send, Max: 4, Gather: time.Hour}
	start := time.Now()
	// Two groups of 8: each fills two batches of 4, sent as they fill,
	// not after the window (10s).
	oks, errs := renewAllTTL(b, 16, func(i int) uint64 { return uint64(i % 2) }, 10*time.Minute)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("full batches took %v: they waited the window", d)
	}
	for i := range 16 {
		if !oks[i] || errs[i] != nil {
			t.Errorf("item %d: ok %t, err %v", i, oks[i], errs[i])
		}
	}
	reqs := r.requests()
	if len(reqs) != 4 {
		t.Fatalf("requests %v, want 4 of 4", reqs)
	}
	for _, req := range reqs {
		if len(req) != 4 {
			t.Errorf("request %v: want 4 renewals", req)
		}
		for _, it := range req {
			if it%2 != req[0]%2 {
				t.Errorf("request %v mixes groups", req)
			}
		}
	}
}

func TestBatcherError(t *testing.T) {
	boom := errors.New("boom")
	r := &recorder{err: boom}
	b := &Batcher[int]{Send: r.send, Gather: time.Second}
	_, errs := renewAll(b, 5, func(int) uint64 { return 0 })
	for i, err := range errs {
		if !errors.Is(err, boom) {
			t.Errorf("item %d: err %v, want the request's", i, err)
		}
	}
	bad := &Batcher[int]{Gather: time.Second, Send: func(_ context.Context, _ []int, report func(int, Verdict)) error {
		report(0, Verdict{OK: true})
		return nil
	}}
	_, errs = renewAll(bad, 3, func(int) uint64 { return 0 })
	reported := 0
	for i, err := range errs {
		switch {
		case err == nil:
			reported++
		case !errors.Is(err, errBatchAnswer):
			t.Errorf("item %d of a short answer: err %v, want errBatchAnswer", i, err)
		}
	}
	if reported != 1 {
		t.Errorf("%d items of a short answer without an error, want the one reported", reported)
	}
}

// A member whose lease stops leaves at once; a leader whose lease stops
// still sends the batch for the others; the request's deadline is the
// latest of its members'.
func TestBatcherLeaving(t *testing.T) {
	r := &recorder{block: make(chan struct{}), entered: make(chan struct{}, 1)}
	// Full at 3: the batch goes out when the third joins, whatever the load.
	b := &Batcher[int]{Send: r.send, Max: 3, Gather: time.Hour}
	const ttl = 10 * time.Minute
	leaderCtx, stopLeader := context.WithCancel(context.Background())
	type out struct {
		ok  bool
		err error
	}
	renew := func(ctx context.Context, item int) chan out {
		c := make(chan out, 1)
		go func() {
			ok, err := b.Renew(ctx, 0, ttl, item)
			c <- out{ok, err}
		}()
		return c
	}
	leaderCtx, stopLeaderDL := context.WithDeadline(leaderCtx, time.Now().Add(time.Minute))
	defer stopLeaderDL()
	leader := renew(leaderCtx, 0)
	joined(t, b, 1)
	late := time.Now().Add(time.Hour)
	mctx, stopMember := context.WithDeadline(context.Background(), late)
	member := renew(mctx, 1)
	joined(t, b, 2)
	sctx, stopStayed := context.WithDeadline(context.Background(), time.Now().Add(30*time.Second))
	defer stopStayed()
	stayed := renew(sctx, 2)
	<-r.entered // the batch of three is being sent
	stopMember()
	if o := <-member; !errors.Is(o.err, context.Canceled) {
		t.Fatalf("a member whose ctx ended: %v, want context.Canceled at once", o.err)
	}
	stopLeader()
	close(r.block)
	if o := <-stayed; !o.ok || o.err != nil {
		t.Fatalf("the member that stayed: ok %t, err %v", o.ok, o.err)
	}
	<-leader
	reqs := r.requests()
	if len(reqs) != 1 || len(reqs[0]) != 3 {
		t.Fatalf("requests %v, want the one batch of 3", reqs)
	}
	if !r.dls[0].Equal(late) {
		t.Errorf("request deadline %v, want the latest member's %v", r.dls[0], late)
	}
}

// joined waits until b's open batch of group 0 has n renewals (the order of
// the goroutines is the test's: the first is the leader).
func joined(t *testing.T, b *Batcher[int], n int) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		b.mu.Lock()
		bt := b.open[0]
		ok := bt != nil && len(bt.items) == n
		b.mu.Unlock()
		if ok {
			return
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the batch did not reach %d renewals", n)
		}
	}
}

// A verdict reported early returns its renewal at once, while Send is
// still at work on another item.
func TestBatcherReportsEarly(t *testing.T) {
	release := make(chan struct{})
	b := &Batcher[int]{Max: 2, Gather: time.Hour, Send: func(_ context.Context, items []int, report func(int, Verdict)) error {
		for i, it := range items {
			if it == 1 {
				report(i, Verdict{OK: true})
			}
		}
		<-release // item 0 is still being asked about
		return errors.New("item 0 timed out")
	}}
	type out struct {
		ok  bool
		err error
	}
	outs := make([]chan out, 2)
	for it := range 2 {
		outs[it] = make(chan out, 1)
		go func() {
			ok, err := b.Renew(context.Background(), 0, 10*time.Minute, it)
			outs[it] <- out{ok, err}
		}()
		if it == 0 {
			joined(t, b, 1)
		}
	}
	if o := <-outs[1]; !o.ok || o.err != nil {
		t.Fatalf("item 1, reported early: ok %t, err %v", o.ok, o.err)
	}
	select {
	case o := <-outs[0]:
		t.Fatalf("item 0 returned %v before Send did", o)
	default:
	}
	close(release)
	if o := <-outs[0]; o.ok || o.err == nil {
		t.Fatalf("item 0, not reported: ok %t, err %v; want Send's error", o.ok, o.err)
	}
}

// With Go, the leader returns as soon as its own verdict is reported, and
// a Go that refuses (a Locker closing) fails the batch.
func TestBatcherGo(t *testing.T) {
	release := make(chan struct{})
	var started sync.WaitGroup
	b := &Batcher[int]{Max: 2, Gather: time.Hour,
		Go: func(f func()) bool { started.Go(f); return true },
		Send: func(_ context.Context, items []int, report func(int, Verdict)) error {
			for i, it := range items {
				if it == 0 {
					report(i, Verdict{OK: true})
				}
			}
			<-release
			return errors.New("item 1 timed out")
		}}
	leader := make(chan error, 1)
	go func() {
		ok, err := b.Renew(context.Background(), 0, 10*time.Minute, 0)
		if err == nil && !ok {
			err = errors.New("not ok")
		}
		leader <- err
	}()
	joined(t, b, 1)
	member := make(chan error, 1)
	go func() {
		ok, err := b.Renew(context.Background(), 0, 10*time.Minute, 1)
		if ok {
			err = errors.New("ok without a verdict")
		}
		member <- err
	}()
	// The leader returns while Send still waits for release.
	select {
	case err := <-leader:
		if err != nil {
			t.Fatalf("the leader, reported early: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the leader did not return while Send was still at work")
	}
	close(release)
	if err := <-member; err == nil {
		t.Error("the member not reported: no error; want Send's")
	}
	started.Wait()

	closing := &Batcher[int]{Gather: time.Millisecond,
		Go:   func(func()) bool { return false },
		Send: func(context.Context, []int, func(int, Verdict)) error { t.Error("Send ran while closing"); return nil }}
	if ok, err := closing.Renew(context.Background(), 0, time.Second, 0); ok || !errors.Is(err, errBatchClosing) {
		t.Errorf("a batch while closing: ok %t, err %v", ok, err)
	}
}
