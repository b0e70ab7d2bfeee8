package sqltable

import (
	"context"
	"database/sql/driver"
	"errors"
)

// acquireRaw runs the PostgreSQL acquire statement on pgx itself (the
// driver package's QueryInt64), through database/sql's Conn.Raw. The
// reason is the context: the Locker's statements always carry one that its
// Close can cancel, and for every Rows of such a context database/sql
// starts a goroutine that waits for it, which costs a good part of an
// uncontended acquisition on a small machine (20-25 µs a statement
// measured on the test machine, where the whole Acquire+Release takes
// about 200); pgx watches the context with context.AfterFunc instead. pgx
// caches the prepared statement per connection, as the database/sql
// statement did. A connection that breaks before the statement could have
// been sent is discarded and the statement tried once more on another, as
// database/sql does. On a connection that is not the driver's (a wrapped
// driver) it returns drivers.ErrNotOwn.
func (l *Locker) acquireRaw(ctx context.Context, args []any) (token int64, ok bool, err error) {
	for try := 0; ; try++ {
		token, ok, err = l.acquireRawOnce(ctx, args)
		var bad badConn
		if !errors.As(err, &bad) {
			return token, ok, err
		}
		if try == 2 || ctx.Err() != nil {
			return token, ok, bad.err
		}
	}
}

// badConn is the error of a statement that did not reach the server on a
// broken connection: database/sql discards the connection (it wraps
// driver.ErrBadConn), acquireRaw tries another, and returns err itself
// when it gives up.
type badConn struct{ err error }

func (e badConn) Error() string   { return e.err.Error() }
func (e badConn) Unwrap() []error { return []error{driver.ErrBadConn, e.err} }

func (l *Locker) acquireRawOnce(ctx context.Context, args []any) (token int64, ok bool, err error) {
	conn, err := l.db.Conn(ctx)
	if err != nil {
		return 0, false, err
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		var err error
		token, ok, err = l.drv.QueryInt64(ctx, dc, l.st.acquire, args...)
		if err != nil && ctx.Err() == nil && l.drv.SafeToRetry != nil && l.drv.SafeToRetry(err) {
			// Nothing reached the server and the connection broke: drop
			// it, try another. (An ended ctx is no fault of the
			// connection's.)
			return badConn{err}
		}
		return err
	})
	return token, ok, err
}
