package sqltable

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"

	"github.com/go-locker/locker/backend"
)

// connGone reports an error that says the statement's connection was gone
// (closed by the server, by a proxy that drops idle links, or reset)
// rather than that the statement failed: a pooled connection that died
// while idle is found dead only when a statement uses it, and database/sql
// retries on another one only when the driver knew before sending. Whether
// the statement took effect is unknown. The driver package adds its
// driver's own such errors (go-sql-driver/mysql's ErrInvalidConn, a
// PostgreSQL FATAL error: the server ended the session). A connection that
// could not be made (a refused or timed-out dial) is not one that was gone:
// the server is unreachable, and running the statement again would not
// help.
func (l *Locker) connGone(err error) bool {
	var ne *net.OpError
	if errors.As(err, &ne) && ne.Op == "dial" {
		return false
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, driver.ErrBadConn) {
		return true
	}
	if l.drv.ConnGone != nil && l.drv.ConnGone(err) {
		return true
	}
	return errors.As(err, &ne)
}

// goneTries bounds the runs of a statement after its connection was found
// gone: every connection of the pool may have died with it (a proxy that
// dropped them, a failover, a server restart) and each costs the statement
// that finds it dead, which drops it from the pool; then one more on a new
// connection. Every open connection counts, not only the idle ones: a
// connection in use now (a bell, another caller's statement, a background
// drop) goes back to the pool dead, and the runs after find it there. (With
// the idle ones only, a Release on MariaDB failed in make test with
// "invalid connection" while the server was up: TestDeadPooledConnections.)
func (l *Locker) goneTries() int { return l.db.Stats().OpenConnections + 2 }

// retryIdem is retry for a statement that has the same effect run twice as
// once (a read, a renewal, the guarded drop of an abandoned row, a
// rolled-back transaction): it runs it again also after its connection was
// found gone, at most goneTries times. database/sql does so only when the
// driver knew the connection was dead before sending; pgx learns that a
// pooled connection died while idle from the reply it does not get.
func (l *Locker) retryIdem(ctx context.Context, f func(context.Context) error) error {
	err := l.retry(ctx, f)
	for tries, limit := 0, 0; err != nil && l.connGone(err) && ctx.Err() == nil; tries++ {
		if tries == 0 {
			limit = l.goneTries()
		}
		if tries >= limit {
			break
		}
		backend.Log{L: l.cfg.Logger}.Debug("locker: sqltable statement found its pooled connection gone; running it again on another", backend.Err(err))
		err = l.retry(ctx, f)
	}
	return err
}

// affectedIdem is affected (exec.go) under retryIdem.
func (l *Locker) affectedIdem(ctx context.Context, exec func(context.Context) (sql.Result, error)) (int64, error) {
	return l.rowsAffected(ctx, l.retryIdem, exec)
}
