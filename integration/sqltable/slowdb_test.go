package sqltable_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"sync"
	"testing"

	"modernc.org/sqlite"
)

// slowDB is an SQLite *sql.DB whose query answers a test can hold: while
// held, a prepared statement's query runs to its end (its rows read, its
// transaction committed) and its answer is kept from the caller until
// the test lets it go: a slow database or network, as the client lives it.
type slowDB struct {
	mu   sync.Mutex
	hold chan struct{} // closed by let; nil while answers pass
}

// Hold keeps the answers of the queries that start from now on until let.
func (s *slowDB) Hold() (let func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.hold = ch
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.hold = nil
			s.mu.Unlock()
			close(ch)
		})
	}
}

func (s *slowDB) held() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hold
}

// openSlowDB opens dsn with modernc.org/sqlite behind a slowDB.
func openSlowDB(t testing.TB, dsn string) (*sql.DB, *slowDB) {
	t.Helper()
	s := &slowDB{}
	db := sql.OpenDB(&slowConnector{s: s, dsn: dsn})
	t.Cleanup(func() { db.Close() })
	return db, s
}

type slowConnector struct {
	s   *slowDB
	dsn string
}

func (c *slowConnector) Connect(context.Context) (driver.Conn, error) {
	inner, err := (&sqlite.Driver{}).Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &slowConn{s: c.s, inner: inner}, nil
}

func (c *slowConnector) Driver() driver.Driver { return &sqlite.Driver{} }

type slowConn struct {
	s     *slowDB
	inner driver.Conn
}

func (c *slowConn) Prepare(q string) (driver.Stmt, error) { return c.inner.Prepare(q) }
func (c *slowConn) Close() error                          { return c.inner.Close() }
func (c *slowConn) Begin() (driver.Tx, error)             { return nil, errors.New("slowdb: no transactions") }

func (c *slowConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	st, err := c.inner.(driver.ConnPrepareContext).PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	return &slowStmt{Stmt: st, s: c.s}, nil
}

func (c *slowConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	return c.inner.(driver.ExecerContext).ExecContext(ctx, q, args)
}

func (c *slowConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	return c.inner.(driver.QueryerContext).QueryContext(ctx, q, args)
}

type slowStmt struct {
	driver.Stmt
	s *slowDB
}

func (st *slowStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return st.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
}

// QueryContext runs the query; while answers are held, it reads all its
// rows (so the statement is over on the database) and returns them once
// let go.
func (st *slowStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := st.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
	hold := st.s.held()
	if err != nil || hold == nil {
		return rows, err
	}
	b := &bufRows{cols: rows.Columns()}
	for {
		dest := make([]driver.Value, len(b.cols))
		err := rows.Next(dest)
		if err == io.EOF {
			break
		}
		if err != nil {
			rows.Close()
			return nil, err
		}
		b.rows = append(b.rows, dest)
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	select {
	case <-hold:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return b, nil
}

// bufRows are rows read ahead.
type bufRows struct {
	cols []string
	rows [][]driver.Value
}

func (b *bufRows) Columns() []string { return b.cols }
func (b *bufRows) Close() error      { return nil }
func (b *bufRows) Next(dest []driver.Value) error {
	if len(b.rows) == 0 {
		return io.EOF
	}
	copy(dest, b.rows[0])
	b.rows = b.rows[1:]
	return nil
}
