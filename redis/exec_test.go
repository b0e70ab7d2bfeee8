package redis

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
)

// blackhole listens on loopback, accepts connections and reads whatever is
// sent, but never answers: a server that hangs, or a partition. The
// connections close at the end of the test, which ends the requests still
// stuck on them.
func blackhole(t *testing.T) string {
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
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); _, _ = io.Copy(io.Discard, c) }()
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

// hangingClient is a client of a server that never answers, with no read
// timeout at all: only a deadline reaches its sockets, never a plain cancel
// (and without ContextTimeoutEnabled not even that).
func hangingClient(t *testing.T, f flavour) *goredis.Client {
	retries := -1
	if f.retries {
		retries = 0 // go-redis's default: 3 retries, also of a timed-out read
	}
	c := goredis.NewClient(&goredis.Options{
		Addr:                  blackhole(t),
		ReadTimeout:           -1,
		WriteTimeout:          -1,
		ContextTimeoutEnabled: f.ctxAware,
		Protocol:              2, // no HELLO handshake: the first request is ours
		DisableIdentity:       true,
		MaxRetries:            retries,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
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
		l := New(hangingClient(t, ctxAware))
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
		l := New(hangingClient(t, ctxAware))
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

// TestCloseOwnClientEndsStuckRequests: a Locker that owns its client (Open)
// closes it in Close, which ends the requests stuck in flight: nothing of
// the Locker runs after Close.
func TestCloseOwnClientEndsStuckRequests(t *testing.T) {
	l, err := Open(context.Background(), "redis://"+blackhole(t)+"?read_timeout=-1&write_timeout=-1&max_retries=-1&protocol=2")
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
	if !l.active.Wait(0) {
		t.Error("a goroutine of the Locker still runs after Close of a Locker that owns its client")
	}
}
