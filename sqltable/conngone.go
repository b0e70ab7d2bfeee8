package sqltable

import (
	"database/sql/driver"
	"errors"
	"io"
	"net"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

// connGone reports an error that says the statement's connection was gone
// (closed by the server, by a proxy that drops idle links, or reset)
// rather than that the statement failed: a pooled connection that died
// while idle is found dead only when a statement uses it, and database/sql
// retries on another one only when the driver knew before sending. Whether
// the statement took effect is unknown.
func connGone(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Severity == "FATAL" // the server ended the session (idle_session_timeout, shutdown)
	}
	var ne *net.OpError
	return errors.As(err, &ne)
}
