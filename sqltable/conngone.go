package sqltable

import (
	"database/sql/driver"
	"errors"
	"io"
	"net"
)

// connGone reports an error that says the statement's connection was gone
// (closed by the server, by a proxy that drops idle links, or reset)
// rather than that the statement failed: a pooled connection that died
// while idle is found dead only when a statement uses it, and database/sql
// retries on another one only when the driver knew before sending. Whether
// the statement took effect is unknown. The driver package adds its
// driver's own such errors (go-sql-driver/mysql's ErrInvalidConn, a
// PostgreSQL FATAL error: the server ended the session).
func (l *Locker) connGone(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, driver.ErrBadConn) {
		return true
	}
	if l.drv.ConnGone != nil && l.drv.ConnGone(err) {
		return true
	}
	var ne *net.OpError
	return errors.As(err, &ne)
}
