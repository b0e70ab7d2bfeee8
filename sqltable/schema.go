package sqltable

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/go-locker/locker"
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
		if err := l.checkSynchronous(ctx); err != nil {
			return err
		}
	}
	if err := l.resolveTable(ctx); err != nil {
		return err
	}
	exist, err := l.tablesExist(ctx)
	if err != nil {
		return err
	}
	if !l.cfg.NoDDL && !exist {
		// A new table: with the families table (famInit adds it to the
		// tables of an earlier release).
		if err := l.runDDL(ctx, append(l.st.ddl, newFamStatements(l.dialect, l.table).ddl...)); err != nil {
			return err
		}
	}
	var v string
	readVersion := func() error {
		return l.retryIdem(ctx, func(ctx context.Context) error {
			return l.db.QueryRowContext(ctx, l.st.version).Scan(&v)
		})
	}
	err = readVersion()
	if errors.Is(err, sql.ErrNoRows) && !l.cfg.NoDDL && exist {
		// Tables made by another client that has not recorded the
		// version yet (or by hand): record it, as the DDL would.
		if err = l.runDDL(ctx, l.st.ddl[len(l.st.ddl)-1:]); err == nil {
			err = readVersion()
		}
	}
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("sqltable: table %s_meta has no schema_version row; create it with the DDL of the package documentation", l.table)
	case err != nil && l.cfg.NoDDL:
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
	if err := l.checkOwnerRoom(ctx); err != nil {
		return err
	}
	if err := l.queueInit(ctx); err != nil {
		return err
	}
	if err := l.ps.prepare(ctx, l); err != nil {
		return err
	}
	if l.bell != nil {
		var v string
		if err := l.retryIdem(ctx, func(ctx context.Context) error {
			return l.db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v)
		}); err != nil {
			return fmt.Errorf("sqltable: read the server's version: %w", err)
		}
		l.mariaDB = strings.Contains(v, "MariaDB")
		l.bell.fractional = l.mariaDB
	}
	if id, err := l.dbIdentity(ctx); err == nil && id != "" {
		l.hubKey = l.dialect.String() + ":" + id + ":" + l.table.String()
		if l.dialect == SQLite {
			// id is the database file. Its signal is written whatever
			// WithNotify says, for the waiters of other processes.
			l.fw = l.drv.JoinFileSignal(id, l.hubKey, l.cfg.notify, procHub.wakeTable)
			if l.cfg.notify {
				l.wake = fileSignal{l.fw} // its waiters watch the file
			}
		}
	} // else New's key, by the *sql.DB, stays
	l.inited = true
	return nil
}

// resolveTable settles which table the Locker uses, once, and qualifies its
// name with the schema, so that every statement on every connection of the
// pool, whatever its search_path or current database, reaches that one
// table, and the wake-up identity names it (see Locker.hubKey). It refuses
// a table that resolves to a temporary schema.
//
// PostgreSQL: an unqualified name is the table it resolves to on the
// search_path if there is one, else the one CREATE would make in the first
// schema of the path (current_schema()). MySQL: an unqualified name is in
// the connection's database. SQLite: in the main database, unless
// WithoutDDL was given and it has none of that name.
func (l *Locker) resolveTable(ctx context.Context) error {
	t, _ := parseTable(l.cfg.table) // checked by WithTable
	var schema sql.NullString
	var temp bool
	var q string
	var args []any
	switch {
	case l.dialect == SQLite && t.schema != "":
		// An attached database of its own per connection (in memory, or
		// a temporary file) is no more shared than temp is.
		var file sql.NullString
		err := l.retryIdem(ctx, func(ctx context.Context) error {
			return l.db.QueryRowContext(ctx, "SELECT file FROM pragma_database_list WHERE name = ?1 COLLATE NOCASE", t.schema).Scan(&file)
		})
		if err == nil && file.String == "" {
			return fmt.Errorf("%w: sqltable: table %q (WithTable, URL parameter lock_table) is in the SQLite database %q, which has no file: each connection has a database of its own there, so two holders of one key would never see each other; name a table in a database file", locker.ErrUnsafeConfig, t.String(), t.schema)
		}
		return l.useTable(t) // an unknown schema: the statements say so
	case t.schema != "":
		return l.useTable(t)
	case l.dialect == SQLite && !l.cfg.NoDDL:
		t.schema = "main"
		return l.useTable(t)
	case l.dialect == SQLite:
		q, args = "SELECT 'main' FROM main.sqlite_master WHERE type = 'table' AND name = ?1", []any{t.name}
	case l.dialect == MySQL:
		q = "SELECT DATABASE()"
	case l.dialect == PostgreSQL:
		// The table the name resolves to, if any, and whether it is a
		// temporary one (pg_temp is searched first, and may be listed
		// first in search_path); else the schema CREATE would use.
		q = `SELECT coalesce((SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)), current_schema()),
	coalesce((SELECT c.relpersistence = 't' FROM pg_class c WHERE c.oid = to_regclass($1)), false)`
		args = []any{t.quoted(PostgreSQL, "")}
	}
	err := l.retryIdem(ctx, func(ctx context.Context) error {
		if l.dialect == PostgreSQL {
			return l.db.QueryRowContext(ctx, q, args...).Scan(&schema, &temp)
		}
		return l.db.QueryRowContext(ctx, q, args...).Scan(&schema)
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return l.useTable(t) // SQLite: not in main; as SQLite resolves it
	case err != nil:
		return fmt.Errorf("sqltable: find the schema of the lock table %s: %w", t, err)
	case !schema.Valid && l.dialect == PostgreSQL:
		return fmt.Errorf("sqltable: the lock table %s is unqualified and the connection's search_path names no schema that exists; qualify the name (WithTable, URL parameter lock_table) or set search_path", t)
	case !schema.Valid:
		return l.useTable(t) // MySQL without a current database: the statements say so
	}
	if _, bad := tempSchema(l.dialect, schema.String); bad || temp {
		return fmt.Errorf("%w: sqltable: the lock table %q resolves to the temporary schema %q (the connection's search_path puts pg_temp first, or a temporary table of that name exists), where each connection has a table of its own: two holders of one key would never see each other; name the table with a permanent schema (WithTable, URL parameter lock_table: \"public.%s\") or take pg_temp out of search_path", locker.ErrUnsafeConfig, t.name, schema.String, t.name)
	}
	t.schema = schema.String
	return l.useTable(t)
}

// useTable makes t the Locker's table, and its statements t's.
func (l *Locker) useTable(t tableName) error {
	if t != l.table {
		l.table = t
		l.st = newStatements(l.dialect, t)
	}
	return nil
}

// tablesExist reports whether the lock table and its meta table exist, so
// that a role with only the rights to read and write them needs no CREATE
// on the schema (PostgreSQL 15 and later and MySQL check it for CREATE
// TABLE IF NOT EXISTS even when the table exists), and, on SQLite, so that
// a Locker's start does not parse and run the DDL's statements again (one
// query instead of five: a locker run on the default is mostly its start).
func (l *Locker) tablesExist(ctx context.Context) (bool, error) {
	var q string
	var args []any
	switch l.dialect {
	case PostgreSQL:
		q = "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL"
		args = []any{l.table.quoted(PostgreSQL, ""), l.table.quoted(PostgreSQL, "_meta")}
	case MySQL:
		if l.table.schema == "" {
			return false, nil
		}
		q = "SELECT COUNT(*) = 2 FROM information_schema.tables WHERE table_schema = ? AND table_name IN (?, ?)"
		args = []any{l.table.schema, l.table.name, l.table.name + "_meta"}
	case SQLite:
		schema := l.table.schema
		if schema == "" {
			schema = "main"
		}
		// schema is an identifier parseTable checked (letters, digits,
		// underscores).
		q = `SELECT COUNT(*) = 2 FROM "` + schema + `".sqlite_master WHERE type = 'table' AND name COLLATE NOCASE IN (?1, ?2)`
		args = []any{l.table.name, l.table.name + "_meta"}
	default:
		return false, nil
	}
	var ok bool
	err := l.retryIdem(ctx, func(ctx context.Context) error {
		return l.db.QueryRowContext(ctx, q, args...).Scan(&ok)
	})
	if err != nil {
		return false, fmt.Errorf("sqltable: look for the lock table %s: %w", l.table, err)
	}
	return ok, nil
}

// runDDL runs statements of the DDL.
func (l *Locker) runDDL(ctx context.Context, stmts []string) error {
	for _, stmt := range stmts {
		err := l.retryIdem(ctx, func(ctx context.Context) error {
			_, err := l.db.ExecContext(ctx, stmt)
			return err
		})
		for try := 0; try < 3 && err != nil && l.drv.RaceLost != nil && l.drv.RaceLost(err); try++ {
			// Clients creating the table at once: PostgreSQL's IF NOT
			// EXISTS is not atomic, and another one won (it committed
			// before this statement failed): run it again, now a no-op.
			_, err = l.db.ExecContext(ctx, stmt)
		}
		if err != nil {
			return fmt.Errorf("sqltable: create the lock table %s: %w", l.table, err)
		}
	}
	return nil
}

// dbIdentity names the database the Locker's pool reaches, for the
// process-wide wake-up hub: Lockers of one process on one database (each
// with a pool of its own, or sharing one) wake each other's waiters, and a
// release on another database with a table of the same name wakes none.
// SQLite: the main database's file; PostgreSQL: the server's address, port
// and start time and the database; MySQL: the server's host name and port.
// The table's name, qualified by resolveTable, completes it.
func (l *Locker) dbIdentity(ctx context.Context) (string, error) {
	var q string
	switch l.dialect {
	case SQLite:
		q = "SELECT file FROM pragma_database_list WHERE name = 'main'"
	case PostgreSQL:
		q = "SELECT concat_ws('/', host(inet_server_addr()), inet_server_port(), pg_postmaster_start_time(), current_database())"
	case MySQL:
		q = "SELECT CONCAT_WS('/', @@hostname, @@port)"
		if l.table.schema == "" {
			q = "SELECT CONCAT_WS('/', @@hostname, @@port, DATABASE())"
		}
	}
	var id sql.NullString
	err := l.retryIdem(ctx, func(ctx context.Context) error {
		return l.db.QueryRowContext(ctx, q).Scan(&id)
	})
	return id.String, err
}

// walMode puts an SQLite database into WAL mode (persistent, per file), in
// which readers and the one writer do not block each other.
func (l *Locker) walMode(ctx context.Context) error {
	var mode string
	err := l.retryIdem(ctx, func(ctx context.Context) error {
		return l.db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode)
	})
	if err != nil {
		return fmt.Errorf("sqltable: read SQLite journal mode: %w", err)
	}
	if mode == "wal" {
		return nil
	}
	err = l.retryIdem(ctx, func(ctx context.Context) error {
		return l.db.QueryRowContext(ctx, "PRAGMA journal_mode = WAL").Scan(&mode)
	})
	if err != nil {
		return fmt.Errorf("sqltable: set SQLite journal mode to WAL: %w", err)
	}
	switch mode {
	case "wal":
	case "memory":
		return fmt.Errorf("%w: sqltable: SQLite database refuses WAL mode (journal mode %q): an in-memory database cannot be shared between connections; use a file", locker.ErrUnsafeConfig, mode)
	default:
		return fmt.Errorf("sqltable: SQLite database refuses WAL mode (journal mode %q): an in-memory database cannot be shared between connections; use a file", mode)
	}
	return nil
}

// sqliteDSN is the DSN that sets what the lock table needs on every
// connection (sqlite.DSN of sqltable/sqlite), with %s for the file.
const sqliteDSN = "%s?_pragma=busy_timeout(50)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"

// checkSynchronous refuses an SQLite connection whose synchronous setting
// is not NORMAL. It is a setting of each connection, which the Locker
// cannot change for the pool it was given: a PRAGMA would change one
// connection of the caller's pool, and the caller's other statements on it
// (and not the pool's later connections); only the DSN sets it on all. So
// it is checked here, on one connection, and the error says which DSN sets
// it. OFF is refused as unsafe: an operating system crash or a power loss
// can corrupt the database. FULL (the default) and EXTRA are refused as
// needlessly slow: they sync the WAL at each commit, a disk flush in every
// acquisition, renewal and release (4 to 5 times the time of the URL's
// Locker, measured), and buy the lock table nothing: a power loss that
// undoes the last commits under NORMAL also ends every process on the host
// that could hold a lock in the file, and the tokens issued after it still
// rise, as they start from the clock (see "SQLite" in the package
// documentation).
func (l *Locker) checkSynchronous(ctx context.Context) error {
	var sync int
	err := l.retryIdem(ctx, func(ctx context.Context) error {
		return l.db.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&sync)
	})
	if err != nil {
		return fmt.Errorf("sqltable: read SQLite's synchronous setting: %w", err)
	}
	if sync == 1 { // NORMAL
		return nil
	}
	var file sql.NullString
	_ = l.retryIdem(ctx, func(ctx context.Context) error {
		return l.db.QueryRowContext(ctx, "SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&file)
	})
	path := file.String
	if path == "" {
		path = "/path/to/locks.db"
	}
	fix := fmt.Sprintf(`synchronous is a setting of each connection, so set it for every connection of the pool in the DSN: sql.Open("sqlite", %q), which DSN of package github.com/go-locker/locker/sqltable/sqlite returns, or open the Locker with the URL sqlite://%s (a pool of the program's own with another setting may share the file)`, fmt.Sprintf(sqliteDSN, path), path)
	switch sync {
	case 0:
		return fmt.Errorf("%w: sqltable: the SQLite connection has synchronous=OFF, with which a crash of the operating system or a power loss can corrupt the lock table; %s", locker.ErrUnsafeConfig, fix)
	case 2, 3:
		name := map[int]string{2: "FULL (SQLite's default)", 3: "EXTRA"}[sync]
		return fmt.Errorf("%w: sqltable: the SQLite connection has synchronous=%s, which flushes the WAL to disk at every commit: each acquisition, renewal and release would wait for the disk, about 4 times as long as with NORMAL, which is as safe for the lock table; %s", locker.ErrInvalidOption, name, fix)
	}
	return fmt.Errorf("%w: sqltable: the SQLite connection has synchronous=%d, which the lock table does not know; %s", locker.ErrInvalidOption, sync, fix)
}

// checkAffectedRows makes sure the MySQL connection reports changed rows,
// not matched ones (the driver's clientFoundRows=true), which the acquire
// statement relies on to tell a taken key from a held one.
func (l *Locker) checkAffectedRows(ctx context.Context) error {
	n, err := l.affected(ctx, func(ctx context.Context) (sql.Result, error) {
		return l.db.ExecContext(ctx, fmt.Sprintf("UPDATE %s SET value = value WHERE name = 'schema_version'", l.table.quoted(MySQL, "_meta")))
	})
	if err != nil {
		return fmt.Errorf("sqltable: check the connection's affected-rows mode: %w", err)
	}
	if n != 0 {
		return errors.New("sqltable: the MySQL connection counts matched rows, not changed ones (clientFoundRows=true in the DSN): the lock table needs it off")
	}
	return nil
}
