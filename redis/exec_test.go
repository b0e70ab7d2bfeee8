package redis

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
)

// blackhole listens on loopback and accepts connections. On the first
// hellos of them (all of them when hellos < 0) it answers the client's
// first request, go-redis's HELLO handshake, with an error (as a server
// without HELLO does, which go-redis accepts), and then never answers
// again: a server that hangs, or a partition, after the connection was
// made. On the others it answers nothing, so go-redis's handshake, and so
// the dial, hangs too. The connections close at the end of the test, which
// ends the requests still stuck on them.
func blackhole(t *testing.T, hellos int) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			hello := hellos < 0 || i < hellos
			wg.Add(1)
			go func() {
				defer wg.Done()
				if hello {
					buf := make([]byte, 4096)
					if _, err := c.Read(buf); err != nil {
						return
					}
					if _, err := io.WriteString(c, "-ERR unknown command 'HELLO'\r\n"); err != nil {
						return
					}
				}
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// hangingClient is a client of a blackhole (see there for hellos), with no
// read timeout at all: only a deadline reaches its sockets, never a plain
// cancel (and without ContextTimeoutEnabled not even that).
func hangingClient(t *testing.T, f flavour, hellos int, opts ...func(*goredis.Options)) *goredis.Client {
	retries := -1
	if f.retries {
		retries = 0 // go-redis's default: 3 retries, also of a timed-out read
	}
	o := &goredis.Options{
		Addr:                  blackhole(t, hellos),
		ReadTimeout:           -1,
		WriteTimeout:          -1,
		ContextTimeoutEnabled: f.ctxAware,
		Protocol:              2,
		DisableIdentity:       true,
		MaxRetries:            retries,
	}
	for _, opt := range opts {
		opt(o)
	}
	c := goredis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// countDials makes a client count the connections it dials in n; every
// dial after the first free ones hangs until the test ends (free < 0: none
// does), like a partition that drops new connections.
func countDials(t *testing.T, n *atomic.Int32, free int32) func(*goredis.Options) {
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	return func(o *goredis.Options) {
		o.DialTimeout = time.Hour
		o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if n.Add(1) > free && free >= 0 {
				<-hang
				return nil, errors.New("test over")
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
	}
}

// flavour is a kind of client: with or without ContextTimeoutEnabled, and
// with go-redis's retries (which retry a request whose read timed out) or
// without.
type flavour struct{ ctxAware, retries bool }

var flavours = []flavour{{true, false}, {false, false}, {true, true}, {false, true}}

// slack is how late a call may return after its context ended or its Locker
// closed; the conformance suite allows the same.
const slack = 500 * time.Millisecond

// TestCancelStopsRequestInFlight: a plain cancel() (no deadline) ends
// TryAcquire and Acquire whose request hangs, within slack, with an error
// naming the key and wrapping context.Canceled, on a client with and without
// ContextTimeoutEnabled and with no read timeout at all.
func TestCancelStopsRequestInFlight(t *testing.T) {
	for _, ctxAware := range flavours {
		l := New(hangingClient(t, ctxAware, -1))
		for _, call := range []struct {
			name string
			fn   func(context.Context, string, ...locker.Option) (locker.Handle, error)
		}{{"TryAcquire", l.TryAcquire}, {"Acquire", l.Acquire}} {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := call.fn(ctx, "k")
				done <- err
			}()
			time.Sleep(100 * time.Millisecond) // the request is on the wire
			cancel()
			cancelled := time.Now()
			select {
			case err := <-done:
				if late := time.Since(cancelled); late > slack {
					t.Errorf("%+v: %s returned %v after cancel", ctxAware, call.name, late)
				}
				var le *locker.Error
				if !errors.Is(err, context.Canceled) || !errors.As(err, &le) || le.Key != "k" {
					t.Errorf("%+v: %s cancelled in flight: %v, want a *locker.Error for \"k\" wrapping context.Canceled", ctxAware, call.name, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("%+v: %s did not return within 5s of cancel", ctxAware, call.name)
			}
		}
		closeQuickly(t, l)
	}
}

// TestAbandonedRequestWritesNothingShared: a request whose caller stopped
// waiting (its context ended) runs on in the background, and nothing it does
// may write what the caller reads once it has returned. An Acquire whose wait
// ends takes its entry out of the key's queue with the attempt's key names,
// which the request still running had filled in lazily, with nothing to order
// the two (the race detector's report on 2cb1d3a, in the Redis Cluster
// conformance run's Context/DeadlineWhileCut). Requests run off the caller's
// goroutine once one came close to inlineWait (a slow link: the first call
// here), and always on a Cluster client without ContextTimeoutEnabled. The race
// detector, which make test runs, is what fails this test.
func TestAbandonedRequestWritesNothingShared(t *testing.T) {
	for _, f := range flavours {
		l := New(hangingClient(t, f, -1), WithAllowEviction(true))
		for i, call := range []struct {
			name string
			fn   func(context.Context, string, ...locker.Option) (locker.Handle, error)
		}{{"TryAcquire", l.TryAcquire}, {"Acquire", l.Acquire}, {"TryAcquire", l.TryAcquire}} {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			_, err := call.fn(ctx, "k")
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%+v: %s on a server that does not answer: %v, want context.DeadlineExceeded", f, call.name, err)
			}
			if i == 0 && l.slowUntil.Load() < time.Now().UnixNano() {
				t.Fatalf("%+v: a request that timed out inline did not turn inline off: the calls after it would not run off the caller's goroutine", f)
			}
		}
		closeQuickly(t, l)
	}
}

// closeQuickly closes l and fails t if that takes long.
func closeQuickly(t *testing.T, l *Locker) {
	t.Helper()
	start := time.Now()
	if err := l.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if took := time.Since(start); took > slack {
		t.Errorf("Close took %v with requests stuck in flight", took)
	}
}

// TestCloseStopsRequestInFlight: Close of a Locker whose Acquire is waiting
// for a reply that never comes returns at once, and the Acquire ends with
// locker.ErrClosed; a later call fails with ErrClosed without a request.
func TestCloseStopsRequestInFlight(t *testing.T) {
	for _, ctxAware := range flavours {
		l := New(hangingClient(t, ctxAware, -1))
		done := make(chan error, 1)
		go func() {
			_, err := l.Acquire(context.Background(), "k")
			done <- err
		}()
		time.Sleep(100 * time.Millisecond)
		closed := time.Now()
		closeQuickly(t, l)
		select {
		case err := <-done:
			if late := time.Since(closed); late > slack {
				t.Errorf("%+v: Acquire returned %v after Close", ctxAware, late)
			}
			if !errors.Is(err, locker.ErrClosed) {
				t.Errorf("%+v: Acquire in flight at Close: %v, want an error wrapping locker.ErrClosed", ctxAware, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%+v: Acquire in flight did not return within 5s of Close", ctxAware)
		}
		if _, err := l.TryAcquire(context.Background(), "k"); !errors.Is(err, locker.ErrClosed) {
			t.Errorf("TryAcquire after Close: %v, want ErrClosed", err)
		}
	}
}

// TestCallsEndWhileDialsHang: the server answers the first connection's
// handshake and then nothing, and every later dial hangs (a partition that
// drops new connections), so that after the first request times out
// go-redis's retry waits on a dial that does not finish. A cancel or a
// Close still ends the call within slack: go-redis waits for a dial only
// on the request's context.
func TestCallsEndWhileDialsHang(t *testing.T) {
	for _, f := range flavours {
		if !f.retries {
			continue
		}
		for _, by := range []string{"cancel", "Close"} {
			var dials atomic.Int32
			l := New(hangingClient(t, f, -1, countDials(t, &dials, 1)))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := l.Acquire(ctx, "k")
				done <- err
			}()
			// Past the first request's inline bound: go-redis is dialling
			// for its retry.
			time.Sleep(inlineWait + 100*time.Millisecond)
			if dials.Load() < 2 {
				t.Errorf("%+v: %d dials: the retry has not started", f, dials.Load())
			}
			ended := time.Now()
			if by == "cancel" {
				cancel()
			} else {
				closeQuickly(t, l)
			}
			select {
			case err := <-done:
				if late := time.Since(ended); late > slack {
					t.Errorf("%+v: Acquire returned %v after %s", f, late, by)
				}
				want := error(context.Canceled)
				if by == "Close" {
					want = locker.ErrClosed
				}
				if !errors.Is(err, want) {
					t.Errorf("%+v: Acquire ended by %s: %v, want an error wrapping %v", f, by, err, want)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("%+v: Acquire did not return within 5s of %s", f, by)
			}
			cancel()
			if by == "cancel" {
				closeQuickly(t, l)
			}
		}
	}
}

// TestInlineTimeoutCostsOneConnection: a request that gets no reply within
// the inline bound is not retried by go-redis on more connections (each
// retry drops the connection it ran on) before it moves off the caller's
// goroutine: a server that stalls costs a waiting request the connection
// it ran on, and the one it waits on after that, not one per retry.
func TestInlineTimeoutCostsOneConnection(t *testing.T) {
	for _, f := range flavours {
		if !f.retries {
			continue
		}
		var dials atomic.Int32
		l := New(hangingClient(t, f, -1, countDials(t, &dials, -1)))
		ctx, cancel := context.WithTimeout(context.Background(), 4*inlineWait)
		_, err := l.TryAcquire(ctx, "k")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%+v: TryAcquire on a stalled server: %v, want DeadlineExceeded", f, err)
		}
		if n := dials.Load(); n > 2 {
			t.Errorf("%+v: %d connections dialled for one request to a stalled server; want at most 2 (inline, then off the caller's goroutine)", f, n)
		}
		closeQuickly(t, l)
	}
}

// TestCloseOwnClientEndsStuckRequests: a Locker that owns its client (Open)
// closes it in Close, which ends the requests stuck in flight: nothing of
// the Locker runs after Close.
func TestCloseOwnClientEndsStuckRequests(t *testing.T) {
	l, err := Open(context.Background(), "redis://"+blackhole(t, -1)+"?read_timeout=-1&write_timeout=-1&max_retries=-1&protocol=2")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := l.TryAcquire(context.Background(), "k")
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	closeQuickly(t, l)
	if err := <-done; !errors.Is(err, locker.ErrClosed) {
		t.Errorf("TryAcquire in flight at Close: %v, want ErrClosed", err)
	}
	if l.life.Active() != 0 {
		t.Error("a goroutine of the Locker still runs after Close of a Locker that owns its client")
	}
}

// earlyDeadline reports its deadline as passed while its timer has not
// fired yet: the moment between a socket deadline set from it firing and
// the context's own timer.
type earlyDeadline struct{ context.Context }

func (earlyDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// TestEndedKeepsDeadlineCause: a request cut short by its context's
// deadline, caught before the context's timer fired, reports the
// context's cause too (context.WithDeadlineCause), not a bare
// context.DeadlineExceeded (on 86a479e: a bare DeadlineExceeded).
func TestEndedKeepsDeadlineCause(t *testing.T) {
	l := New(nil)
	defer l.Close()
	cause := errors.New("the caller's deadline")
	ctx, cancel := context.WithDeadlineCause(context.Background(), time.Now().Add(30*time.Millisecond), cause)
	defer cancel()
	err := l.ended(earlyDeadline{ctx}, l.life.Closing())
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, cause) {
		t.Errorf("ended = %v, want an error wrapping context.DeadlineExceeded and the cause", err)
	}
}
