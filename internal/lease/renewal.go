// Renewal keeps the lease of a held lock for the lease-based backends
// (redis, sqltable, Redlock, and etcd's loss timer): it renews the lease at
// intervals while the lock is held, and declares the lock lost by the
// client's own monotonic clock once no renewal has succeeded in time, even
// while a renewal request hangs.
//
// A Renewal costs one runtime timer and no goroutine while it waits: the Go
// runtime keeps every timer of the process in a per-P min-heap, so a Locker
// holding ten thousand locks has ten thousand timers in that heap, not ten
// thousand parked goroutines with their stacks. The timer is armed for the
// Renewal's next event, whichever comes first: the next renewal, the check
// of a renewal in flight for slowness, or the deadline (a renewal is due
// well before it, so the deadline is the next event only while a renewal
// hangs, or without a watchdog). Each firing runs on a goroutine of its own,
// started by the runtime: a renewal that hangs does not hold the loss back.
// (Until December 2026 there were two timers, the loss's and the renewal's:
// one more to make and stop on every acquisition; issue 32.)
//
// The deadline is sent + TTL − Drift, where sent is when the acquiring (or
// the last successful renewing) request left the client: the server started
// the lease no earlier than that, so the lock is surely ours until then. The
// next renewal is due Interval after the last successful one was sent, not
// after its reply came, so that slow round trips do not push renewals towards
// the deadline.

package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// ErrGone is the cause given to Config.Lost when a renewal found the lock no
// longer held by its owner on the server (Renew returned false, nil).
var ErrGone = errors.New("renewal found the lock no longer ours: its lease ran out and it may have been taken")

// ErrExpired is wrapped by the cause given to Config.Lost when the deadline
// passed with no successful renewal.
var ErrExpired = errors.New("lease may have run out")

// Config says how to keep one lease.
type RenewConfig struct {
	// TTL is the lease the server grants on acquisition and on each renewal.
	TTL time.Duration
	// Drift is the safety margin: the lease counts as surely held until
	// sent + TTL − Drift. It must be smaller than TTL.
	Drift time.Duration
	// Interval is the time from one successful renewal's send to the next
	// renewal; 0 means TTL/3.
	Interval time.Duration
	// Retry is the time from a failed renewal to the next attempt; 0 means
	// max(TTL/20, 5ms).
	Retry time.Duration
	// Renew extends the lease on the server. Its ctx ends at the current
	// deadline (renewing later could not help: the holder has been told of
	// the loss by then) or when the Lease stops. It returns ok=false with a
	// nil error when the lock is no longer ours (the lease is then lost at
	// once), and an error for a transient failure (retried after Retry).
	// Nil means no watchdog: the lease ends at its deadline unless Extended
	// moves it.
	Renew func(ctx context.Context) (ok bool, err error)
	// Lost is called at most once, when the lease is lost, with the cause
	// (not wrapped in locker.ErrLost; the backend does that). It runs on a
	// goroutine of its own (a timer's), inside Go if Go is set.
	Lost func(cause error)
	// Failed, if set, is called after each renewal that failed with a
	// transient error (it is retried): the lease is at risk. Renewed, if
	// set, is called after each renewal that succeeded (and each Extended).
	// Both run outside the Renewal's lock, on the renewing goroutine.
	Failed  func(err error)
	Renewed func()
	// events, if set, receives the reports instead of Lost, Failed and
	// Renewed: a Handle passes itself, so that keeping a lease makes no
	// closure of those three per lock (issue 32).
	events events
	// renewer, if set, renews instead of Renew: a Handle's Ops (see
	// Handle.Start), so that a lock's watchdog needs no method value of
	// its backend's handle (issue 32).
	renewer renewer
	// Go, if set, runs f while the owner counts it as active, on the calling
	// goroutine, so that the owner's Close can wait for renewals and loss
	// reports in progress; it returns false without running f when the owner
	// is closing (the owner then ends the lock itself).
	Go func(f func()) bool
}

// renewer extends a lease on the server (RenewConfig.Renew's contract).
type renewer interface {
	Renew(ctx context.Context) (ok bool, err error)
}

// renewFunc is a RenewConfig.Renew as a renewer.
type renewFunc func(ctx context.Context) (bool, error)

func (f renewFunc) Renew(ctx context.Context) (bool, error) { return f(ctx) }

// events is what a lease reports to its Handle (see RenewConfig.events).
type events interface {
	leaseLost(cause error)
	renewFailed(err error)
	renewed()
}

// funcEvents gives a RenewConfig's Lost, Failed and Renewed as events, so
// that a Renewal has one way to report (StartRenewal makes it when events
// is not set).
type funcEvents struct {
	lost, failed func(error)
	ok           func()
}

func (f *funcEvents) leaseLost(cause error) { f.lost(cause) }

func (f *funcEvents) renewFailed(err error) {
	if f.failed != nil {
		f.failed(err)
	}
}

func (f *funcEvents) renewed() {
	if f.ok != nil {
		f.ok()
	}
}

// Lease keeps one lease. Its methods are safe for concurrent use.
type Renewal struct {
	cfg      RenewConfig
	ev       events  // cfg.events, or cfg's Lost, Failed and Renewed
	renew    renewer // cfg.renewer, or cfg.Renew; nil: no watchdog
	interval time.Duration
	retry    time.Duration

	mu       sync.Mutex
	deadline time.Time          // until when the lock is surely ours (monotonic)
	timer    *time.Timer        // armed for the next event (see rearm)
	inflight context.CancelFunc // cancels the renewal in flight, if any
	sentAt   time.Time          // when the renewal in flight was sent
	slow     bool               // the renewal in flight was reported slow (Failed)
	gen      uint64             // counts the renewals sent
	tries    int                // renewals sent since the last that succeeded (for the loss message)
	cbMu     sync.Mutex         // orders the calls of Failed and Renewed
	due      time.Time          // when the next renewal is due (see rearm)
	lastErr  error              // the last failed renewal, for the loss message
	stopped  bool
	lost     bool
	lostDone chan struct{} // closed once Lost has returned
}

// Start keeps a lease whose acquiring request was sent at sent. It panics if
// TTL or Drift are out of range or Lost is nil: those are the backend's bugs,
// not the user's input, and are checked where the user's options are.
func StartRenewal(sent time.Time, cfg RenewConfig) *Renewal {
	if cfg.TTL <= 0 || cfg.Drift < 0 || cfg.Drift >= cfg.TTL || cfg.Lost == nil && cfg.events == nil {
		panic(fmt.Sprintf("renew.Start: bad config: TTL %v, Drift %v, Lost set %t", cfg.TTL, cfg.Drift, cfg.Lost != nil || cfg.events != nil))
	}
	l := &Renewal{cfg: cfg, ev: cfg.events, interval: cfg.Interval, retry: cfg.Retry, deadline: sent.Add(cfg.TTL - cfg.Drift), lostDone: make(chan struct{})}
	if l.ev == nil {
		l.ev = &funcEvents{lost: cfg.Lost, failed: cfg.Failed, ok: cfg.Renewed}
	}
	switch {
	case cfg.renewer != nil:
		l.renew = cfg.renewer
	case cfg.Renew != nil:
		l.renew = renewFunc(cfg.Renew)
	}
	if l.interval <= 0 {
		l.interval = cfg.TTL / 3
	}
	if l.retry <= 0 {
		l.retry = max(cfg.TTL/20, 5*time.Millisecond)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	next := l.deadline
	if l.renew != nil {
		l.due = sent.Add(l.interval)
		next = earlier(next, l.due)
	}
	l.timer = time.AfterFunc(time.Until(next), l.fire)
	return l
}

// run runs f inside the owner's Go, if any; false when Go refused it.
func (l *Renewal) run(f func()) bool {
	if l.cfg.Go == nil {
		f()
		return true
	}
	return l.cfg.Go(f)
}

// Deadline returns until when the lock is surely held, on the monotonic
// clock of this process.
func (l *Renewal) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Expired reports whether the deadline has passed at now: the lock may be
// gone on the server even if Lost has not been called yet (the process was
// paused past it, say, and its caller ran first when it resumed). A
// Release whose request then fails must report the loss, not a release.
func (l *Renewal) Expired(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !now.Before(l.deadline)
}

// Check declares the loss at once, on the calling goroutine (inside Go, if
// set), when the deadline has passed and the lease is still kept: Lost runs
// before Check returns. Handle.Err and Handle.Done call it, so that a holder
// looking at its lock after a pause past the deadline (a GC pause, a stopped
// process, a suspended VM) is told it is lost at its first look, not only
// once the loss timer, due during the pause, has had its turn to run. It
// costs a lock and a clock reading while the lease is kept.
//
// If the loss timer is declaring the loss at that moment, Check waits until
// it has (Lost must therefore not call Check, nor Err or Done of a handle on
// the lease).
func (l *Renewal) Check() {
	l.mu.Lock()
	due := !l.stopped && !time.Now().Before(l.deadline)
	losing := l.lost
	l.mu.Unlock()
	switch {
	case due:
		l.run(l.check)
		l.mu.Lock()
		losing = l.lost
		l.mu.Unlock()
		if losing {
			<-l.lostDone
		}
	case losing:
		<-l.lostDone
	}
}

// Extended records a renewal that succeeded and whose request was sent at
// sent: the server reset the lease no earlier than that. It is for renewals
// made outside Renew (etcd's keep-alive), and does nothing once the Lease
// has stopped.
func (l *Renewal) Extended(sent time.Time) {
	l.mu.Lock()
	stopped := l.stopped
	l.extend(sent)
	l.mu.Unlock()
	if !stopped {
		l.renewed()
	}
}

func (l *Renewal) extend(sent time.Time) {
	if l.stopped {
		return
	}
	if d := sent.Add(l.cfg.TTL - l.cfg.Drift); d.After(l.deadline) {
		l.deadline = d
	}
	l.lastErr, l.tries = nil, 0
}

// Stop stops renewals and the loss check, and cancels a renewal in flight
// (without waiting for it). It reports whether the lease was still kept:
// false if Lost has been called or Stop had been called before.
func (l *Renewal) Stop() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return false
	}
	l.stopLocked()
	return true
}

func (l *Renewal) stopLocked() {
	l.stopped = true
	l.timer.Stop()
	if l.inflight != nil {
		l.inflight()
		l.inflight = nil
	}
}

// lose stops the lease and reports the loss, once.
func (l *Renewal) lose(cause error) {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	l.lost = true
	l.stopLocked()
	l.mu.Unlock()
	defer close(l.lostDone)
	l.ev.leaseLost(cause)
}

// fire runs when the timer fires, on a goroutine of its own: the loss
// check once the deadline has passed, else what renewOnce has to do.
func (l *Renewal) fire() {
	l.mu.Lock()
	stopped, past := l.stopped, !time.Now().Before(l.deadline)
	l.mu.Unlock()
	switch {
	case stopped:
	case past || l.renew == nil:
		l.run(l.check)
	case !l.run(l.renewOnce):
		// The owner is closing and ends the lock itself; the loss is
		// still checked for at the deadline (and refused too, unless
		// the owner has stopped the lease by then).
		l.mu.Lock()
		if now := time.Now(); !l.stopped && now.Before(l.deadline) {
			l.timer.Reset(l.deadline.Sub(now))
		}
		l.mu.Unlock()
	}
}

// rearm arms the timer for the next event: the deadline, or before it
// the next renewal (none in flight), or the slow check of the renewal in
// flight (not reported slow yet). l.mu is held. A firing that finds nothing
// due (a timer run late, raced by a renewal's answer) re-arms it; a
// firing early costs a look, never a missed event, since each path of
// fire ends with the timer armed for what is left.
func (l *Renewal) rearm(now time.Time) {
	next := l.deadline
	if l.renew != nil {
		switch {
		case l.inflight == nil:
			next = earlier(next, l.due)
		case !l.slow:
			next = earlier(next, l.sentAt.Add(l.retry))
		}
	}
	l.timer.Reset(max(next.Sub(now), 0))
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// check declares the loss once the deadline has passed, and re-arms the
// timer otherwise (a renewal moved the deadline since it was armed).
//
// The timer, not the renewal, declares the loss: a renewal request may hang
// (a partition, a paused server) past the deadline, and the holder must hear
// of the loss before the server lets anyone else in.
func (l *Renewal) check() {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	if now := time.Now(); now.Before(l.deadline) {
		l.rearm(now)
		l.mu.Unlock()
		return
	}
	// What the renewals did, so that the loss says whether they failed,
	// hung (a server or a pool that did not answer) or were never sent (a
	// process starved of CPU, whose timers did not run).
	var inflight string
	if l.inflight != nil {
		inflight = fmt.Sprintf("; a renewal sent %v ago has not answered", time.Since(l.sentAt).Round(time.Millisecond))
	}
	var cause error
	switch {
	case l.renew == nil:
		cause = fmt.Errorf("%w: not renewed within TTL %v minus drift margin %v", ErrExpired, l.cfg.TTL, l.cfg.Drift)
	case l.lastErr != nil:
		cause = fmt.Errorf("%w: no renewal succeeded within TTL %v minus drift margin %v (%d sent)%s; last renewal error: %w", ErrExpired, l.cfg.TTL, l.cfg.Drift, l.tries, inflight, l.lastErr)
	case l.tries == 0:
		cause = fmt.Errorf("%w: no renewal was sent within TTL %v minus drift margin %v (the renewal timer did not run in time)", ErrExpired, l.cfg.TTL, l.cfg.Drift)
	default:
		cause = fmt.Errorf("%w: no renewal succeeded within TTL %v minus drift margin %v (%d sent)%s", ErrExpired, l.cfg.TTL, l.cfg.Drift, l.tries, inflight)
	}
	l.mu.Unlock()
	l.lose(cause)
}

// ErrSlow is the error given to Config.Failed for a renewal that has
// not answered within Retry: a partition or a stalled server holds the
// request, and it may not answer before the lease runs out.
var ErrSlow = errors.New("renewal has not answered")

// renewOnce runs when the timer fires before the deadline: when a renewal
// is due, and Retry after a renewal was sent, to report it slow if it has
// not answered (a request that hangs fails only at the deadline, too late
// to warn of anything).
func (l *Renewal) renewOnce() {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	now := time.Now()
	if l.inflight != nil {
		// The slow check (or a stale run of the timer).
		report := !l.slow && !now.Before(l.sentAt.Add(l.retry))
		if report {
			l.slow = true
		}
		l.rearm(now)
		since, gen := now.Sub(l.sentAt), l.gen
		l.mu.Unlock()
		if report {
			// Unless the renewal answered meanwhile: its Renewed must
			// come after, not before, this report.
			l.cbMu.Lock()
			l.mu.Lock()
			still := l.inflight != nil && l.gen == gen && !l.stopped
			l.mu.Unlock()
			if still {
				l.ev.renewFailed(fmt.Errorf("%w in %v", ErrSlow, since.Round(time.Millisecond)))
			}
			l.cbMu.Unlock()
		}
		return
	}
	if now.Before(l.due) {
		// An early or stale run of the timer.
		l.rearm(now)
		l.mu.Unlock()
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), l.deadline)
	l.inflight, l.sentAt, l.slow = cancel, now, false
	l.gen++
	l.tries++
	l.rearm(now) // the slow check, or the deadline
	l.mu.Unlock()

	sent := now
	ok, err := l.renew.Renew(ctx)
	cancel()

	l.mu.Lock()
	l.inflight = nil
	if l.stopped {
		l.mu.Unlock()
		return
	}
	switch {
	case err == nil && ok:
		l.extend(sent)
		l.due = sent.Add(l.interval)
		l.rearm(time.Now())
		l.mu.Unlock()
		l.renewed()
		return
	case err == nil:
		l.mu.Unlock()
		l.lose(ErrGone)
		return
	default:
		// Transient (network, failover, timeout): retry soon; the loss
		// timer ends the lock if no renewal succeeds in time.
		l.lastErr = err
		now := time.Now()
		l.due = now.Add(l.retry)
		l.rearm(now)
		l.mu.Unlock()
		l.cbMu.Lock()
		l.ev.renewFailed(err)
		l.cbMu.Unlock()
	}
}

// renewed calls Renewed, in order with Failed.
func (l *Renewal) renewed() {
	l.cbMu.Lock()
	l.ev.renewed()
	l.cbMu.Unlock()
}

// Slot holds a handle's Lease, stored once renew.Start has returned; until
// then (and in a zero Slot) its methods do nothing, or report the lease as
// not expired. Handles keep their lease in a Slot so that Err, Done, Release
// and the loss path read it the same way, without a lock of their own.
type Slot struct{ p atomic.Pointer[Renewal] }

// Set stores l.
func (s *Slot) Set(l *Renewal) { s.p.Store(l) }

// Get returns the Lease, or nil before Set.
func (s *Slot) Get() *Renewal { return s.p.Load() }

// Check is Lease.Check on the stored Lease, if any.
func (s *Slot) Check() {
	if l := s.p.Load(); l != nil {
		l.Check()
	}
}

// Stop is Lease.Stop on the stored Lease, if any.
func (s *Slot) Stop() {
	if l := s.p.Load(); l != nil {
		l.Stop()
	}
}

// Expired is Lease.Expired on the stored Lease; false before Set.
func (s *Slot) Expired(now time.Time) bool {
	l := s.p.Load()
	return l != nil && l.Expired(now)
}
