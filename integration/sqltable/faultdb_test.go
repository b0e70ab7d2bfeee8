package sqltable_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync"
	"testing"

	"modernc.org/sqlite"
)

// faultDB is an SQLite *sql.DB whose statements a test can make hang (a
// cut: as if the process could not get at the file, every statement waits
// until heal or its context ends) or fail (a crash: the process is gone
// and says nothing more). SQLite has no network to cut, so the fault sits
// between database/sql and the driver, above SQLite's own locking: a cut
// client holds no SQLite lock and blocks nobody else.
type faultDB struct {
	mu   sync.Mutex
	cut  chan struct{} // closed when healed; nil while not cut
	dead bool
}

var errCrashed = errors.New("faultdb: this client crashed")

// gate waits while the client is cut and fails once it crashed.
func (f *faultDB) gate(ctx context.Context) error {
	f.mu.Lock()
	cut, dead := f.cut, f.dead
	f.mu.Unlock()
	if dead {
		return errCrashed
	}
	if cut != nil {
		select {
		case <-cut:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (f *faultDB) Cut() (heal func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan struct{})
	f.cut = ch
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			f.cut = nil
			f.mu.Unlock()
			close(ch)
		})
	}
}

func (f *faultDB) Crash() {
	f.mu.Lock()
	f.dead = true
	f.mu.Unlock()
}

// openFaultDB opens dsn with modernc.org/sqlite behind a faultDB.
func openFaultDB(t testing.TB, dsn string) (*sql.DB, *faultDB) {
	t.Helper()
	f := &faultDB{}
	db := sql.OpenDB(&faultConnector{f: f, dsn: dsn})
	t.Cleanup(func() { db.Close() })
	return db, f
}

type faultConnector struct {
	f   *faultDB
	dsn string
}

func (c *faultConnector) Connect(ctx context.Context) (driver.Conn, error) {
	if err := c.f.gate(ctx); err != nil {
		return nil, err
	}
	inner, err := (&sqlite.Driver{}).Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &faultConn{f: c.f, inner: inner}, nil
}

func (c *faultConnector) Driver() driver.Driver { return &sqlite.Driver{} }

type faultConn struct {
	f     *faultDB
	inner driver.Conn
}

func (c *faultConn) Prepare(q string) (driver.Stmt, error) { return c.inner.Prepare(q) }
func (c *faultConn) Close() error                          { return c.inner.Close() }
func (c *faultConn) Begin() (driver.Tx, error) {
	return nil, errors.New("faultdb: Begin without a context")
}

// BeginTx begins a transaction behind the gate; its statements pass the
// gate too (a cut holds them), its Commit and Rollback do not: a client cut
// within a transaction hangs at its next statement, and its context's end
// rolls the transaction back.
func (c *faultConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if err := c.f.gate(ctx); err != nil {
		return nil, err
	}
	return c.inner.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (c *faultConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	if err := c.f.gate(ctx); err != nil {
		return nil, err
	}
	st, err := c.inner.(driver.ConnPrepareContext).PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	return &faultStmt{Stmt: st, f: c.f}, nil
}

// faultStmt is a prepared statement behind the faultDB's gate.
type faultStmt struct {
	driver.Stmt
	f *faultDB
}

func (st *faultStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if err := st.f.gate(ctx); err != nil {
		return nil, err
	}
	return st.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (st *faultStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if err := st.f.gate(ctx); err != nil {
		return nil, err
	}
	return st.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
}

func (c *faultConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	if err := c.f.gate(ctx); err != nil {
		return nil, err
	}
	return c.inner.(driver.ExecerContext).ExecContext(ctx, q, args)
}

func (c *faultConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	if err := c.f.gate(ctx); err != nil {
		return nil, err
	}
	return c.inner.(driver.QueryerContext).QueryContext(ctx, q, args)
}
