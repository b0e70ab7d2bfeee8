package sqltable

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker/backend"
)

// noConnector is a database/sql connector that never connects: a pool
// whose limit the tests set and read, with no server behind it.
type noConnector struct{}

func (noConnector) Connect(context.Context) (driver.Conn, error) {
	return nil, errors.New("no server")
}
func (noConnector) Driver() driver.Driver { return nil }

// TestAcquisitionShare: on a pool of 6, the acquisitions take at most 6
// less the pins on pool connections less one; a further one waits for one
// of them to end; a bell's pin is refused where it would take the
// connection left to the renewals, a listener's (a connection of its own)
// is not.
func TestAcquisitionShare(t *testing.T) {
	db := sql.OpenDB(noConnector{})
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(6)
	ps := joinPins(db)
	t.Cleanup(ps.leave)
	l := &Locker{life: backend.NewLife[*Handle](nil), pins: ps}
	ctx := context.Background()
	enter := func(want bool) func() {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		defer cancel()
		exit, err := ps.enter(cctx)
		if got := err == nil; got != want {
			t.Fatalf("enter with %d in flight and %d pooled pins: let in %t, want %t", ps.busy, ps.pooled.Load(), got, want)
		}
		return exit
	}
	var exits []func()
	for range 4 {
		exits = append(exits, enter(true))
	}
	bell := ps.take(l, false, true, func() {})
	if bell == nil {
		t.Fatal("a bell's pin refused with 4 of 6 connections taken: it leaves one")
	}
	enter(false) // 4 acquisitions + the bell + the reserve
	if p := ps.take(l, true, true, func() {}); p != nil {
		t.Fatal("a bell wait's pin taken where it takes the renewals' connection")
	}
	listener := ps.take(l, false, false, func() {})
	if listener == nil {
		t.Fatal("the listener's pin, on a connection of its own, refused")
	}
	exits[0]()
	exits[0]() // a second call does nothing
	exits[0] = enter(true)
	enter(false)
	ps.drop(bell)
	exits = append(exits, enter(true))
	ps.drop(listener)
	for _, exit := range exits {
		exit()
	}
	if ps.busy != 0 {
		t.Fatalf("%d acquisitions counted after every one ended", ps.busy)
	}
}

// TestAcquisitionShareFIFO: acquisitions waiting for their share enter in
// the order they came, one per acquisition that ends; one that stops
// waiting (its context ended) passes its turn to the next.
func TestAcquisitionShareFIFO(t *testing.T) {
	ps, queued := shareOfOne(t)
	ctx := context.Background()
	first, err := ps.enter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A waiter that gives up first: it must not keep the others out.
	gaveUp := make(chan error, 1)
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		exit, err := ps.enter(cctx)
		if err == nil {
			exit()
		}
		gaveUp <- err
	}()
	queued(1)
	const n = 8
	order := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			exit, err := ps.enter(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			exit()
		})
		queued(i + 2)
	}
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiter whose context ended: %v, want context.Canceled", err)
	}
	first()
	for want := range n {
		select {
		case got := <-order:
			if got != want {
				t.Fatalf("acquisition %d entered where %d, which waited longer, was next", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("acquisition %d did not enter after the ones before it ended", want)
		}
	}
	wg.Wait()
	if ps.busy != 0 || len(ps.queue) != 0 {
		t.Fatalf("%d acquisitions counted and %d waiting after every one ended", ps.busy, len(ps.queue))
	}
}

// TestAcquisitionShareGiveUpRace: the first waiter gives up just as the
// acquisition ahead of it ends (either may come first); whether it took
// its turn or gave it up, the waiter behind it enters, woken, not found by
// the re-check of the limit.
func TestAcquisitionShareGiveUpRace(t *testing.T) {
	ps, waiting := shareOfOne(t)
	ctx := context.Background()
	for range 200 {
		first, err := ps.enter(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		quitter := make(chan struct{})
		go func() {
			defer close(quitter)
			if exit, err := ps.enter(cctx); err == nil {
				exit()
			}
		}()
		waiting(1)
		behind := make(chan struct{})
		go func() {
			defer close(behind)
			exit, err := ps.enter(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			exit()
		}()
		waiting(2)
		go cancel()
		first()
		select {
		case <-behind:
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter behind one that gave up as its turn came was not let in")
		}
		<-quitter
	}
	if ps.busy != 0 || len(ps.queue) != 0 {
		t.Fatalf("%d acquisitions counted and %d waiting after every one ended", ps.busy, len(ps.queue))
	}
}

// shareOfOne returns the pins of a pool of 2 (a share of one acquisition)
// whose waiters are woken only by the ends of the others (the limit's
// re-check off), and a function that waits until n acquisitions wait.
func shareOfOne(t *testing.T) (*pinSet, func(n int)) {
	old := gateRecheck
	gateRecheck = time.Hour
	t.Cleanup(func() { gateRecheck = old })
	db := sql.OpenDB(noConnector{})
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(2)
	ps := joinPins(db)
	t.Cleanup(ps.leave)
	return ps, func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Microsecond) {
			ps.busyMu.Lock()
			q := len(ps.queue)
			ps.busyMu.Unlock()
			if q == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d acquisitions waiting, want %d", q, n)
			}
		}
	}
}
