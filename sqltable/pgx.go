package sqltable

import (
	"context"
	"database/sql/driver"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// errNotPGX says db's connections are not pgx's (a wrapped driver): the
// acquire goes through database/sql from then on.
var errNotPGX = errors.New("sqltable: not a pgx connection")

// acquirePGX runs the PostgreSQL acquire statement on pgx itself, through
// database/sql's Conn.Raw. The reason is the context: the Locker's
// statements always carry one that its Close can cancel, and for every
// Rows of such a context database/sql starts a goroutine that waits for
// it, which costs a good part of an uncontended acquisition on a small
// machine (20-25 µs a statement measured on the test machine, where the
// whole Acquire+Release takes about 200); pgx watches the context with
// context.AfterFunc instead. pgx caches the prepared statement per
// connection, as the database/sql statement did. A connection that breaks
// before the statement could have been sent is discarded and the statement
// tried once more on another, as database/sql does.
func (l *Locker) acquirePGX(ctx context.Context, key, owner string, ttl time.Duration) (token int64, ok bool, err error) {
	for try := 0; ; try++ {
		token, ok, err = l.acquirePGXOnce(ctx, key, owner, ttl)
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
// driver.ErrBadConn), acquirePGX tries another, and returns err itself
// when it gives up.
type badConn struct{ err error }

func (e badConn) Error() string   { return e.err.Error() }
func (e badConn) Unwrap() []error { return []error{driver.ErrBadConn, e.err} }

func (l *Locker) acquirePGXOnce(ctx context.Context, key, owner string, ttl time.Duration) (token int64, ok bool, err error) {
	conn, err := l.db.Conn(ctx)
	if err != nil {
		return 0, false, err
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		sc, isPGX := dc.(*stdlib.Conn)
		if !isPGX {
			return errNotPGX
		}
		err := sc.Conn().QueryRow(ctx, l.st.acquire, key, owner, ttl.Microseconds()).Scan(&token)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return nil
		case err != nil && ctx.Err() == nil && pgconn.SafeToRetry(err):
			// Nothing reached the server and the connection broke: drop
			// it, try another. (An ended ctx is no fault of the
			// connection's.)
			return badConn{err}
		case err != nil:
			return err
		}
		ok = true
		return nil
	})
	return token, ok, err
}
