package sqltable

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/base64"
	"strconv"
	"sync"
	"time"

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
// key for less than bellDelay, a holder whose bell connection failed, one
// whose process died: the server frees the named locks of a closed
// session), and then falls back on one round of its back-off before it
// waits for the bell again, so that it never spins. It waits for the bell
// at most until its retry interval or the holder's lease ends, whichever
// comes first, as it would sleep. A holder rings only after bellDelay
// because most locks are held for less: they would pay two statements for
// nothing, and their waiters' first back-off rounds (2 ms, doubling) come
// as soon.
//
// Bell names are "locker:" and a hash of the database's identity, the table
// and the key (named locks are server-wide; MySQL allows 64 characters).

// bellDelay is how long a holder holds before it rings its key's bell.
const bellDelay = 5 * time.Millisecond

// maxBellWaits bounds the pool connections a Locker's waiters keep waiting
// for bells (one per waited key, its head waiter in this process): a quarter
// of a limited pool, at most this many.
const maxBellWaits = 4

// bellTake bounds how long a holder's ring waits for the bell: a waiter may
// hold it for a moment (between its GET_LOCK and its RELEASE_LOCK).
const bellTake = 50 * time.Millisecond

type bell struct {
	l     *Locker
	rings *timerq.Queue // bellDelay after each grant
	waits chan struct{} // semaphore of the waits for bells in flight

	stateMu sync.Mutex // guards the Handles' bellState

	connMu sync.Mutex // one statement at a time on conn
	conn   *sql.Conn  // holds the bells this Locker rings; nil until needed, or after a failure
}

// A Handle's bell, guarded by bell.stateMu.
const (
	bellNone      = iota // not rung (not MySQL, or the ring failed)
	bellScheduled        // the ring is due bellDelay after the grant
	bellRung             // the Locker's bell connection holds it
	bellDone             // the lock ended: no ring any more
)

// newBell returns the bell of a MySQL Locker with WithNotify(true) whose
// pool has room for it (see minListenPool), else nil.
func newBell(l *Locker) *bell {
	if l.dialect != MySQL || !l.cfg.notify {
		return nil
	}
	max := l.db.Stats().MaxOpenConnections
	if max != 0 && max < minListenPool {
		return nil
	}
	waits := maxBellWaits
	if max != 0 {
		waits = min(waits, max/minListenPool)
	}
	return &bell{l: l, rings: timerq.New(bellDelay), waits: make(chan struct{}, waits)}
}

// name is key's bell, quoted as an SQL string literal. The statements
// carry it (and their timeout) as literals, not as parameters: a statement
// with parameters costs go-sql-driver/mysql three round trips (prepare,
// execute, close) unless the DSN sets interpolateParams, and the name's
// characters (base64url and ':') need no escaping.
func (b *bell) name(key string) string {
	sum := sha256.Sum256([]byte(b.l.hubKey + "\x00" + key))
	return "'locker:" + base64.RawURLEncoding.EncodeToString(sum[:]) + "'"
}

func getLock(name string, timeout time.Duration) string {
	return "SELECT GET_LOCK(" + name + ", " + strconv.FormatFloat(timeout.Seconds(), 'f', 3, 64) + ")"
}

func releaseLock(name string) string { return "DO RELEASE_LOCK(" + name + ")" }

// schedule rings h's bell bellDelay after now, unless h ends first.
func (b *bell) schedule(h *Handle) {
	if b == nil {
		return
	}
	procHub.hold(b.l.hubKey, h.key)
	b.stateMu.Lock()
	defer b.stateMu.Unlock()
	h.bellState = bellScheduled
	h.bellEntry = b.rings.Add(func() {
		b.l.spawn(func() { b.ring(h) })
	})
}

// ring takes h's bell on the Locker's bell connection, if h still holds.
func (b *bell) ring(h *Handle) {
	b.connMu.Lock()
	defer b.connMu.Unlock()
	b.stateMu.Lock()
	due := h.bellState == bellScheduled
	b.stateMu.Unlock()
	if !due {
		return
	}
	ctx, cancel := context.WithTimeout(b.l.ctx, bellTake+time.Second)
	defer cancel()
	var got sql.NullInt64
	err := b.connLocked(ctx, func(c *sql.Conn) error {
		return c.QueryRowContext(ctx, getLock(b.name(h.key), bellTake)).Scan(&got)
	})
	b.stateMu.Lock()
	defer b.stateMu.Unlock()
	if h.bellState == bellScheduled {
		h.bellState = bellNone
		if err == nil && got.Valid && got.Int64 == 1 {
			h.bellState = bellRung
		}
	}
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
	b.stateMu.Unlock()
	if was == bellDone {
		return
	}
	procHub.unhold(b.l.hubKey, h.key)
	if was != bellRung {
		return // a ring already started sees bellDone
	}
	// After the release, off the caller's path.
	b.l.spawn(func() {
		b.connMu.Lock()
		defer b.connMu.Unlock()
		ctx, cancel := context.WithTimeout(b.l.endCtx, time.Second)
		defer cancel()
		_ = b.connLocked(ctx, func(c *sql.Conn) error {
			_, err := c.ExecContext(ctx, releaseLock(b.name(h.key)))
			return err
		})
	})
}

// connLocked runs f on the bell connection, opening it if needed; on an
// error the connection is discarded, which frees every bell it held. connMu
// is held.
func (b *bell) connLocked(ctx context.Context, f func(*sql.Conn) error) error {
	if b.conn == nil {
		c, err := b.l.db.Conn(ctx)
		if err != nil {
			return err
		}
		b.conn = c
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
	_ = b.conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = b.conn.Close()
	b.conn = nil
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

// wait waits, on a connection of the pool, until key's bell is free or
// limit has passed, whichever comes first, and gives the bell back at once
// if it got it. rang reports that it got the bell: its holder gave it back
// (or nobody held it). ok is false when it could not wait (too many waits
// already, no connection, a server that does not wait), and the caller
// sleeps instead.
func (b *bell) wait(ctx context.Context, key string, limit time.Duration) (rang, ok bool) {
	if b == nil || limit < bellDelay {
		return false, false // a short wait: sleep it
	}
	select {
	case b.waits <- struct{}{}:
	default:
		return false, false
	}
	defer func() { <-b.waits }()
	c, err := b.l.db.Conn(ctx)
	if err != nil {
		return false, false
	}
	defer c.Close()
	name := b.name(key)
	start := time.Now()
	var got sql.NullInt64
	if err := c.QueryRowContext(ctx, getLock(name, limit)).Scan(&got); err != nil || !got.Valid {
		return false, false
	}
	if got.Int64 != 1 {
		// A timeout. A server that rounds the timeout down (to 0) answers
		// at once: sleep instead, so as not to spin.
		return false, time.Since(start) >= limit/2
	}
	if _, err := c.ExecContext(ctx, releaseLock(name)); err != nil {
		// Still ours: the connection must not go back to the pool.
		_ = c.Raw(func(any) error { return driver.ErrBadConn })
	}
	return true, true
}
