package sqltable

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/backoff"
	"github.com/go-locker/locker/sqltable/internal/drivers"
)

// listener is the waker of a PostgreSQL Locker (see hub.go): it keeps one
// connection of the Locker's pool listening on the table's channel, from
// the first wait until Close, and wakes the process's waiters of each key
// released anywhere.
type listener struct {
	l       *Locker
	enabled atomic.Bool

	mu        sync.Mutex
	started   bool
	listening bool
	ready     chan struct{} // closed when LISTEN is in effect
	stop      context.CancelFunc
	done      chan struct{}
}

func newListener(l *Locker) *listener {
	ls := &listener{l: l, ready: make(chan struct{})}
	// The pool's limit is read when the listener takes its connection
	// (see pool.go), not here: the caller may change it after New.
	ls.enabled.Store(l.dialect == PostgreSQL && l.cfg.notify && l.drv.Listen != nil)
	return ls
}

// start starts the listener if it is not running and waits, boundedly,
// until it listens; it reports whether it does.
func (ls *listener) start(ctx context.Context) bool {
	if ls == nil || !ls.enabled.Load() || !ls.l.pins.fits() {
		return false // no listener, or a pool too small for one now
	}
	ls.mu.Lock()
	if !ls.started {
		lctx, stop := context.WithCancel(ls.l.life.Closing())
		done := make(chan struct{})
		if !ls.l.life.Go(func() { defer close(done); ls.run(lctx) }) {
			stop()
			ls.mu.Unlock()
			return false
		}
		ls.started, ls.stop, ls.done = true, stop, done
	}
	ready := ls.ready
	ls.mu.Unlock()
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-ready:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// wait does not wait: the listener wakes the waiters through procHub.
func (*listener) wait(context.Context, *waiter, string, time.Duration) (bool, bool) {
	return false, false
}

// up reports whether the listener is listening now.
func (ls *listener) up() bool {
	if ls == nil || !ls.enabled.Load() {
		return false
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.listening
}

func (ls *listener) close() {
	ls.mu.Lock()
	stop, done := ls.stop, ls.done
	ls.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

func (ls *listener) setListening(on bool) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if on == ls.listening {
		return
	}
	ls.listening = on
	if on {
		close(ls.ready)
	} else {
		ls.ready = make(chan struct{})
	}
}

// listenIdle turns off the listening session's idle_session_timeout where
// the server has one.
const listenIdle = `SELECT pg_catalog.set_config('idle_session_timeout', '0', false) WHERE pg_catalog.current_setting('idle_session_timeout', true) IS NOT NULL`

// run listens until ctx ends, reconnecting after a failure.
func (ls *listener) run(ctx context.Context) {
	back := backoff.New(50*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		if ls.listenOnce(ctx) {
			back.Reset()
			if ctx.Err() == nil {
				backend.Log{L: ls.l.cfg.Logger}.Warn("locker: sqltable LISTEN connection ended; listening again on another")
			}
		}
		ls.setListening(false)
		back.Wait(ctx)
	}
}

// listenOnce takes the settings of a pooled connection, listens on a
// connection of its own made with them (see drivers.Driver.Listen) until it
// fails, ctx ends or the pool's limit drops too low for it (see pool.go),
// then closes it. The pin is the Locker's count of it (see pool.go): the
// pool does not see it. It reports whether LISTEN took effect.
func (ls *listener) listenOnce(ctx context.Context) (listened bool) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p := ls.l.pins.take(ls.l, false, false, cancel)
	if p == nil {
		return false // no room in the pool now: waiters poll
	}
	defer ls.l.pins.drop(p)
	conn, err := ls.l.db.Conn(ctx)
	if err != nil {
		return false
	}
	var listen func(context.Context, []string, func(), func(string)) error
	err = conn.Raw(func(dc any) error {
		var err error
		listen, err = ls.l.drv.Listen(dc)
		return err
	})
	_ = conn.Close() // it never listened: back to the pool
	if err != nil {
		if errors.Is(err, drivers.ErrNotOwn) {
			ls.enabled.Store(false) // a wrapped driver: no LISTEN
		}
		return false
	}
	// The listening session is idle by design: a server that ends idle
	// sessions (idle_session_timeout, PostgreSQL 14+) would end it again
	// and again, each time costing the waiters a round of tries
	// (listenIdle).
	setup := []string{`LISTEN "` + ls.l.table.channel() + `"`, listenIdle}
	ready := func() {
		listened = true
		ls.setListening(true)
		// Releases made while nobody listened were not heard.
		procHub.wakeTable(ls.l.hubKey)
	}
	notify := func(payload string) {
		// "!owner": a lock family's waiting row admitted (see
		// families.go).
		if owner, ok := strings.CutPrefix(payload, "!"); ok {
			procHub.wakeOwner(owner)
			return
		}
		// The payload is "owner:key" (owners have no ':').
		if owner, key, ok := strings.Cut(payload, ":"); ok {
			procHub.wake(ls.l.hubKey, key, owner)
		}
	}
	_ = listen(ctx, setup, ready, notify)
	return listened
}
