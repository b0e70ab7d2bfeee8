package sqltable

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"

	"github.com/go-locker/locker/internal/pgrace"
)

// init creates the tables (unless WithoutDDL) and checks the schema
// version, once per Locker; a failure is tried again by the next call.
func (l *Locker) init(ctx context.Context) error {
	select {
	case l.initSem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-l.initSem }()
	if l.inited {
		return nil
	}
	if l.dialect == SQLite {
		if err := l.walMode(ctx); err != nil {
			return err
		}
	}
	if l.cfg.ddl {
		for _, stmt := range l.st.ddl {
			err := l.retry(ctx, func(ctx context.Context) error {
				_, err := l.db.ExecContext(ctx, stmt)
				return err
			})
			for try := 0; try < 3 && err != nil && l.dialect == PostgreSQL && pgrace.Lost(err); try++ {
				// Clients creating the table at once: PostgreSQL's IF NOT
				// EXISTS is not atomic, and another one won (it committed
				// before this statement failed): run it again, now a no-op.
				_, err = l.db.ExecContext(ctx, stmt)
			}
			if err != nil {
				return fmt.Errorf("sqltable: create the lock table %s: %w", l.table, err)
			}
		}
	}
	var v string
	err := l.retry(ctx, func(ctx context.Context) error {
		return l.db.QueryRowContext(ctx, l.st.version).Scan(&v)
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("sqltable: table %s_meta has no schema_version row; create it with the DDL of the package documentation", l.table)
	case err != nil && !l.cfg.ddl:
		return fmt.Errorf("sqltable: read the schema version from %s_meta (WithoutDDL: the tables must exist; see DDL): %w", l.table, err)
	case err != nil:
		return fmt.Errorf("sqltable: read the schema version from %s_meta: %w", l.table, err)
	}
	if n, err := strconv.Atoi(v); err != nil || n != SchemaVersion {
		return fmt.Errorf("sqltable: lock table %s has schema version %q; this release uses version %d (a newer release made it, or the meta table was changed)", l.table, v, SchemaVersion)
	}
	if l.dialect == MySQL {
		if err := l.checkAffectedRows(ctx); err != nil {
			return err
		}
	}
	if err := l.ps.prepare(ctx, l); err != nil {
		return err
	}
	if l.bell != nil {
		var v string
		if err := l.retry(ctx, func(ctx context.Context) error {
			return l.db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v)
		}); err != nil {
			return fmt.Errorf("sqltable: read the server's version: %w", err)
		}
		l.bell.fractional = strings.Contains(v, "MariaDB")
	}
	if id, err := l.dbIdentity(ctx); err == nil && id != "" {
		l.hubKey = l.dialect.String() + ":" + id + ":" + l.table.String()
		if l.dialect == SQLite {
			// id is the database file. Its signal is written whatever
			// WithNotify says, for the waiters of other processes.
			l.fw = joinFileWake(id, l.hubKey, l.cfg.notify)
		}
	} // else New's key, by the *sql.DB, stays
	l.inited = true
	return nil
}

// dbIdentity names the database the Locker's pool reaches, for the
// process-wide wake-up hub: Lockers of one process on one database (each
// with a pool of its own, or sharing one) wake each other's waiters, and a
// release on another database with a table of the same name wakes none.
// SQLite: the main database's file; PostgreSQL: the server's address, port
// and start time, the database and the schema unqualified names resolve
// to; MySQL: the server's host name and port and the database.
func (l *Locker) dbIdentity(ctx context.Context) (string, error) {
	var q string
	switch l.dialect {
	case SQLite:
		q = "SELECT file FROM pragma_database_list WHERE name = 'main'"
	case PostgreSQL:
		q = "SELECT concat_ws('/', host(inet_server_addr()), inet_server_port(), pg_postmaster_start_time(), current_database(), current_schema())"
	case MySQL:
		q = "SELECT CONCAT_WS('/', @@hostname, @@port, DATABASE())"
	}
	var id sql.NullString
	err := l.retry(ctx, func(ctx context.Context) error {
		return l.db.QueryRowContext(ctx, q).Scan(&id)
	})
	return id.String, err
}

// walMode puts an SQLite database into WAL mode (persistent, per file), in
// which readers and the one writer do not block each other.
func (l *Locker) walMode(ctx context.Context) error {
	var mode string
	err := l.retry(ctx, func(ctx context.Context) error {
		return l.db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode)
	})
	if err != nil {
		return fmt.Errorf("sqltable: read SQLite journal mode: %w", err)
	}
	if mode == "wal" {
		return nil
	}
	err = l.retry(ctx, func(ctx context.Context) error {
		return l.db.QueryRowContext(ctx, "PRAGMA journal_mode = WAL").Scan(&mode)
	})
	if err != nil {
		return fmt.Errorf("sqltable: set SQLite journal mode to WAL: %w", err)
	}
	if mode != "wal" {
		return fmt.Errorf("sqltable: SQLite database refuses WAL mode (journal mode %q): an in-memory database cannot be shared between connections; use a file", mode)
	}
	return nil
}

// checkAffectedRows makes sure the MySQL connection reports changed rows,
// not matched ones (the driver's clientFoundRows=true), which the acquire
// statement relies on to tell a taken key from a held one.
func (l *Locker) checkAffectedRows(ctx context.Context) error {
	var n int64
	err := l.retry(ctx, func(ctx context.Context) error {
		res, err := l.db.ExecContext(ctx, fmt.Sprintf("UPDATE %s SET value = value WHERE name = 'schema_version'", l.table.quoted(MySQL, "_meta")))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return fmt.Errorf("sqltable: check the connection's affected-rows mode: %w", err)
	}
	if n != 0 {
		return errors.New("sqltable: the MySQL connection counts matched rows, not changed ones (clientFoundRows=true in the DSN): the lock table needs it off")
	}
	return nil
}

// transient reports errors after which the statement is known not to have
// taken effect and may simply run again: SQLite's busy and locked
// databases (another connection or process writes), deadlocks and lock-wait
// timeouts, which roll the statement back.
func transient(err error) bool {
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case 5, 6: // SQLITE_BUSY, SQLITE_LOCKED
			return true
		}
		return false
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number == 1213 || me.Number == 1205 // deadlock, lock wait timeout
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "40P01" || pe.Code == "40001" // deadlock, serialization failure
	}
	return false
}

// retry runs f until it succeeds, fails for good, or ctx ends, sleeping a
// little (jittered, growing to 50ms) after each transient failure.
func (l *Locker) retry(ctx context.Context, f func(context.Context) error) error {
	l.pins.check() // a pool shrunk below the pins: they give way (pool.go)
	wait := time.Millisecond
	for {
		err := f(ctx)
		if err == nil || !transient(err) {
			return err
		}
		d := wait/2 + rand.N(wait/2+1)
		wait = min(wait*2, 50*time.Millisecond)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (while the database was busy: %v)", ctx.Err(), err)
		}
	}
}

// prepared are the statements of the lock operations, prepared once per
// Locker (and by database/sql once per connection): one round trip each on
// MySQL instead of a prepare, an execute and a close, and no parsing on
// SQLite.
type prepared struct {
	acquire, renew, release, drop, remaining *sql.Stmt
}

func (p *prepared) prepare(ctx context.Context, l *Locker) error {
	var errs []error
	for _, s := range []struct {
		dst  **sql.Stmt
		text string
	}{
		{&p.acquire, l.st.acquire},
		{&p.renew, l.st.renew},
		{&p.release, l.st.release},
		{&p.drop, l.st.drop},
		{&p.remaining, l.st.remaining},
	} {
		if *s.dst != nil {
			continue
		}
		err := l.retry(ctx, func(ctx context.Context) error {
			st, err := l.db.PrepareContext(ctx, s.text)
			*s.dst = st
			return err
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sqltable: prepare the lock statements: %w", err)
	}
	return nil
}

func (p *prepared) close() error {
	var errs []error
	for _, st := range []*sql.Stmt{p.acquire, p.renew, p.release, p.drop, p.remaining} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(errs...)
}
