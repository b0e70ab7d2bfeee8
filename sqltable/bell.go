package sqltable

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/base64"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/go-locker/locker/internal/backoff"
	"github.com/go-locker/locker/internal/timerq"
)

// The bell wakes, on MySQL and MariaDB, the waiters of other processes when
// a lock they wait for is released. Neither server can notify a client, but
// both have named locks (GET_LOCK), which a session waits for and gets the
// moment their holder gives them back. So a holder takes the key's named
// lock (its "bell") on a connection of its Locker's own, bellDelay after the
// grant, and gives it back right after the release; the head waiter of the
// key in another process, instead of sleeping its back-off, waits in
// GET_LOCK for the bell and, once it has it, gives it back at once (so that
// the waiters of other processes get it in turn) and tries the key.
//
// The row stays the only truth: the bell only says when to try. A waiter
// gets the bell at once when nobody rings it (a holder that has held the
// key for less than bellDelay, a holder of an older release or without a
// bell, one whose bell connection failed or whose process died: the server
// frees the named locks of a closed session); it then sleeps its back-off,
// which keeps growing while the bell keeps coming at once, so a key held
// without a bell is polled as before, plus a GET_LOCK and a RELEASE_LOCK
// per round. A waiter that did wait and got the bell starts its back-off
// again from 2 ms. It waits for the bell at most until its retry interval
// or the holder's lease ends, whichever comes first, as it would sleep. A
// holder rings only after bellDelay because most locks are held for less:
// they would pay two statements for nothing, and their waiters' first
// back-off rounds (2 ms, doubling) come as soon.
//
// The timeout of GET_LOCK is fractional on MariaDB (since 10.1.2); MySQL
// reads whole seconds, so there a waiter waits for the bell only when it
// would sleep a second or more (the default retry interval is one). Several
// named locks per session need MySQL 5.7 or MariaDB 10.0.2; on older
// servers a second ring frees the first bell (the bell fails, not the
// lock).
//
// Bell names are "locker:" and a hash of the database's identity, the table
// and the key (named locks are server-wide; MySQL allows 64 characters).

// bellDelay is how long a holder holds before it rings its key's bell.
const bellDelay = 5 * time.Millisecond

// A waiter may hold the bell for a moment (between its GET_LOCK and its
// RELEASE_LOCK), and the previous holder (in another process) gives it back
// a moment after its release: a ring that finds the bell taken tries again
// bellTries times, bellRetry apart, without keeping the bell connection
// from the other rings and the releases of the Locker meanwhile.
const (
	bellTries = 5
	bellRetry = 2 * time.Millisecond
)

type bell struct {
	l          *Locker
	rings      *timerq.Queue // bellDelay after each grant
	fractional bool          // the server takes fractional GET_LOCK timeouts (MariaDB); set by init

	stateMu sync.Mutex // guards the Handles' bellState

	connMu sync.Mutex // one statement at a time on conn
	conn   *sql.Conn  // holds the bells this Locker rings; nil until needed, or after a failure
	pin    *pin       // conn's pin (see pool.go)
}

// A Handle's bell, guarded by bell.stateMu. While the state is scheduled,
// rung or unrung, the Handle counts in procHub's held keys.
const (
	bellIdle      = iota // not scheduled yet
	bellScheduled        // the ring is due bellDelay after the grant
	bellRung             // the Locker's bell connection holds it
	bellUnrung           // the ring failed: the lock is held without its bell
	bellDone             // the lock ended: no ring any more
)

// newBell returns the bell of a MySQL Locker with WithNotify(true), else
// nil. Whether the pool has room for its connections is decided when it
// takes them (see pool.go), not here: the caller may change the pool's
// limit after New.
func newBell(l *Locker) *bell {
	if l.dialect != MySQL || !l.cfg.notify {
		return nil
	}
	return &bell{l: l, rings: timerq.New(bellDelay)}
}

// name is key's bell, quoted as an SQL string literal. The statements
// carry it (and their timeout) as literals, not as parameters: a statement
// with parameters costs go-sql-driver/mysql three round trips (prepare,
// execute, close) unless the DSN sets interpolateParams, and the name's
// characters (base64url and ':') need no escaping.
func (b *bell) name(key string) string { return "'" + b.l.BellName(key) + "'" }

// getLock is the GET_LOCK statement of the bell name with timeout; whole
// seconds (rounded down) unless the server takes fractions.
func getLock(name string, timeout time.Duration, fractional bool) string {
	t := strconv.FormatFloat(timeout.Seconds(), 'f', 3, 64)
	if !fractional {
		t = strconv.FormatInt(int64(timeout/time.Second), 10)
	}
	return "SELECT GET_LOCK(" + name + ", " + t + ")"
}

func releaseLock(name string) string { return "DO RELEASE_LOCK(" + name + ")" }

// BellName returns the MySQL named lock that is key's bell (see Waiting in
// the package documentation), without quotes, as IS_USED_LOCK takes it: for
// operators and tests, to see which connection holds it. It is valid once
// the Locker has made its first call (which reads the database's identity),
// and "" on other dialects.
func (l *Locker) BellName(key string) string {
	if l.dialect != MySQL {
		return ""
	}
	sum := sha256.Sum256([]byte(l.hubKey + "\x00" + key))
	return "locker:" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// schedule rings h's bell bellDelay after now, unless h ends first.
func (b *bell) schedule(h *Handle) {
	if b == nil {
		return
	}
	b.stateMu.Lock()
	defer b.stateMu.Unlock()
	if h.bellState != bellIdle {
		return // ended already (a loss or a Close that came first)
	}
	procHub.hold(b.l.hubKey, h.bellKey())
	h.bellState = bellScheduled
	h.bellEntry = b.rings.Add(func() {
		b.l.life.Go(func() { b.ring(h) })
	})
}

// ring takes h's bell on the Locker's bell connection, if h still holds.
// A bell that another session holds for a moment is tried again; a ring
// that finds h ended by the time the bell is its own gives it back at once.
func (b *bell) ring(h *Handle) {
	if !b.l.pins.fits() {
		b.setUnrung(h) // a pool too small for a bell connection now
		return
	}
	name := b.name(h.bellKey())
	for try := 1; ; try++ {
		if got, _ := b.ringOnce(h, name); got {
			return
		}
		// Taken for a moment, or the bell connection failed (it was
		// discarded; the next try opens another).
		if try >= bellTries || !b.due(h) {
			b.setUnrung(h)
			return
		}
		if !backoff.Sleep(b.l.life.Closing(), bellRetry) {
			b.setUnrung(h)
			return
		}
	}
}

// ringOnce tries once to take h's bell; got reports that h holds it now.
func (b *bell) ringOnce(h *Handle, name string) (got bool, err error) {
	b.connMu.Lock()
	defer b.connMu.Unlock()
	if !b.due(h) {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(b.l.life.Closing(), time.Second)
	defer cancel()
	var v sql.NullInt64
	err = b.connLocked(ctx, func(c *sql.Conn) error {
		return c.QueryRowContext(ctx, getLock(name, 0, true)).Scan(&v)
	})
	if err != nil || !v.Valid || v.Int64 != 1 {
		return false, err
	}
	b.stateMu.Lock()
	due := h.bellState == bellScheduled
	if due {
		h.bellState = bellRung
	}
	b.stateMu.Unlock()
	if !due {
		// h ended while the statement ran, and its unring had nothing to
		// give back yet: give the bell back now.
		b.giveBackLocked(ctx, name)
	}
	return true, nil
}

// due reports whether h's ring is still to be made.
func (b *bell) due(h *Handle) bool {
	b.stateMu.Lock()
	defer b.stateMu.Unlock()
	return h.bellState == bellScheduled
}

// setUnrung records that h holds its lock without its bell.
func (b *bell) setUnrung(h *Handle) {
	b.stateMu.Lock()
	if h.bellState == bellScheduled {
		h.bellState = bellUnrung
	}
	b.stateMu.Unlock()
}

// unring gives h's bell back (h's lock has ended: released, lost or given
// up), or keeps it from being rung.
func (b *bell) unring(h *Handle) {
	if b == nil {
		return
	}
	b.stateMu.Lock()
	was := h.bellState
	h.bellState = bellDone
	if h.bellEntry != nil {
		h.bellEntry.Stop()
	}
	if was != bellIdle && was != bellDone {
		procHub.unhold(b.l.hubKey, h.bellKey())
	}
	b.stateMu.Unlock()
	if was != bellRung {
		return // a ring in flight sees bellDone and gives the bell back itself
	}
	// After the release, off the caller's path.
	b.l.life.Go(func() {
		b.connMu.Lock()
		defer b.connMu.Unlock()
		ctx, cancel := context.WithTimeout(b.l.endCtx, time.Second)
		defer cancel()
		b.giveBackLocked(ctx, b.name(h.bellKey()))
	})
}

// giveBackLocked gives the bell name back on the bell connection (a failure
// discards the connection, which gives it back too). connMu is held.
func (b *bell) giveBackLocked(ctx context.Context, name string) {
	_ = b.connLocked(ctx, func(c *sql.Conn) error {
		_, err := c.ExecContext(ctx, releaseLock(name))
		return err
	})
}

// connLocked runs f on the bell connection, opening it if needed; on an
// error the connection is discarded, which frees every bell it held. connMu
// is held.
func (b *bell) connLocked(ctx context.Context, f func(*sql.Conn) error) error {
	if b.conn == nil {
		var p *pin
		p = b.l.pins.take(b.l, false, true, func() { b.l.life.Go(func() { b.dropPin(&p) }) })
		if p == nil {
			return errNoRoom
		}
		c, err := b.l.db.Conn(ctx)
		if err == nil {
			// The bell connection is idle while it holds bells: a
			// wait_timeout would free them under their holders (their
			// waiters would only poll). It is discarded afterwards, never
			// pooled.
			_, err = c.ExecContext(ctx, "SET SESSION wait_timeout = 2147483")
			if err != nil {
				discard(c)
			}
		}
		if err != nil {
			b.l.pins.drop(p)
			return err
		}
		b.conn, b.pin = c, p
	}
	err := f(b.conn)
	if err != nil {
		b.dropLocked()
	}
	return err
}

// dropLocked discards the bell connection: a connection that holds named
// locks must not go back to the pool. connMu is held.
func (b *bell) dropLocked() {
	if b.conn == nil {
		return
	}
	discard(b.conn)
	b.l.pins.drop(b.pin)
	b.conn, b.pin = nil, nil
}

// dropPin discards the bell connection if *p is still its pin: the pool's
// limit dropped too low for it (see pool.go). The bells it held are freed;
// their waiters try the keys and, finding them held, poll.
// (*p is read once connMu is held: connLocked sets it under connMu.)
func (b *bell) dropPin(p **pin) {
	b.connMu.Lock()
	defer b.connMu.Unlock()
	if b.pin == *p {
		b.dropLocked()
	}
}

// errNoRoom is a bell connection not taken: the pool's limit leaves no room
// for it now (see pool.go).
var errNoRoom = errors.New("sqltable: no room in the pool for the bell connection")

// discard closes c without giving it back to the pool: it may hold named
// locks.
func discard(c *sql.Conn) {
	_ = c.Raw(func(any) error { return driver.ErrBadConn })
	_ = c.Close()
}

// close discards the bell connection, freeing the bells it holds; for
// Close, once nothing else runs.
func (b *bell) close() {
	if b == nil {
		return
	}
	b.connMu.Lock()
	b.dropLocked()
	b.connMu.Unlock()
}

// start starts nothing: a waiter waits for the bell itself (wait).
func (*bell) start(context.Context) bool { return false }

// up is false: no release wakes a waiter unless it waits for the bell.
func (*bell) up() bool { return false }

// wait waits, when w is the waiter of key that only another process's
// release can wake (procHub.needsBell), on a connection of the pool, until
// key's bell is free or limit has passed, whichever comes first, and gives the bell back at once
// if it got it. rang reports that it waited for the bell and got it: its
// holder gave it back. ok is false when it did not wait: too many waits
// already, no connection, a bell that nobody held (it came at once), a
// server that answered before limit (one that takes whole seconds only),
// and the caller sleeps instead. The waits of the Lockers of one *sql.DB
// take at most maxBellWaits connections, or a quarter of a limited pool,
// and end early when the pool's limit drops too low (see pool.go).
func (b *bell) wait(ctx context.Context, w *waiter, key string, limit time.Duration) (rang, ok bool) {
	if b == nil || limit < bellDelay || !b.fractional && limit < time.Second {
		return false, false // a short wait: sleep it
	}
	if !procHub.needsBell(w) {
		return false, false // a release in this process wakes w
	}
	return b.await(ctx, key, limit)
}

// await waits for the bell of key (a mutex key, or a family row's
// bellKey), as wait does, whoever else waits in this process.
func (b *bell) await(ctx context.Context, key string, limit time.Duration) (rang, ok bool) {
	if b == nil || limit < bellDelay || !b.fractional && limit < time.Second {
		return false, false // a short wait: sleep it
	}
	// The wait ends a little after limit whatever happens (a pool with no
	// free connection, a dead link, a server that waits longer than asked:
	// the driver then closes the connection, which ends the wait on the
	// server), so a waiter never oversleeps its retry interval or the
	// holder's lease by more.
	sctx, cancel := context.WithTimeout(ctx, limit+100*time.Millisecond)
	defer cancel()
	p := b.l.pins.take(b.l, true, true, cancel)
	if p == nil {
		return false, false // too many waits, or no room in the pool now
	}
	defer b.l.pins.drop(p)
	c, err := b.l.db.Conn(sctx)
	if err != nil {
		return false, false
	}
	defer c.Close()
	name := b.name(key)
	var got sql.NullInt64
	// Timed from here, not from before the connection: a connection that
	// had to be dialled, or waited for, would make a bell that came at
	// once look rung, and the waiter would poll from 2ms again.
	start := time.Now()
	if err := c.QueryRowContext(sctx, getLock(name, limit, b.fractional)).Scan(&got); err != nil || !got.Valid {
		return false, false
	}
	took := time.Since(start)
	if got.Int64 != 1 {
		// A timeout; one that came well before limit did not wait.
		return false, took >= limit/2
	}
	start = time.Now()
	rctx, rcancel := context.WithTimeout(ctx, time.Second)
	defer rcancel()
	if _, err := c.ExecContext(rctx, releaseLock(name)); err != nil {
		// Still ours: the connection must not go back to the pool.
		discard(c)
		return false, false
	}
	// The bell came at once (in about the round trip RELEASE_LOCK took):
	// nobody held it, so it says nothing about the key. Sleep, so that a
	// key held without a bell (a holder of an older release, or without a
	// bell connection, a dead holder's lease) is polled with the back-off,
	// not once a round trip.
	if took < 2*time.Since(start)+time.Millisecond {
		return false, false
	}
	return true, true
}
