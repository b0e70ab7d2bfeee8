package sqltable

import (
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"reflect"
	"regexp"
	"strings"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/sqltable/internal/drivers"
)

// Dialect is the SQL dialect a Locker speaks. New detects it from the
// *sql.DB's driver; WithDialect names it for a driver New does not know (a
// wrapper around one of the three, for instance). Each dialect needs its
// driver package imported (see "Drivers and imports" in the package
// documentation).
type Dialect int

const (
	// DialectAuto detects the dialect from the driver (the default).
	DialectAuto Dialect = iota
	// PostgreSQL 12 or later, through github.com/jackc/pgx/v5/stdlib;
	// driver package github.com/go-locker/locker/sqltable/pgx.
	PostgreSQL
	// MySQL 8.0 or later, or MariaDB 10.5 or later, through
	// github.com/go-sql-driver/mysql; driver package
	// github.com/go-locker/locker/sqltable/mysql.
	MySQL
	// SQLite 3.42 or later, through modernc.org/sqlite; driver package
	// github.com/go-locker/locker/sqltable/sqlite.
	SQLite
)

func (d Dialect) String() string {
	switch d {
	case PostgreSQL:
		return "postgresql"
	case MySQL:
		return "mysql"
	case SQLite:
		return "sqlite"
	default:
		return "auto"
	}
}

// detectDialect names the dialect of db's driver, from the driver packages
// the program imported.
func detectDialect(db *sql.DB) (Dialect, *drivers.Driver, error) {
	if drv := drivers.Detect(db.Driver()); drv != nil {
		return Dialect(drv.Dialect), drv, nil
	}
	t := reflect.TypeOf(db.Driver())
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t != nil {
		if d, ok := drivers.DriverPackages[t.PkgPath()]; ok {
			return DialectAuto, nil, fmt.Errorf("%w: sqltable: the *sql.DB's driver is %s's, whose dialect (%s) is in a package this program does not import: import _ %q (forgotten import?)", locker.ErrInvalidOption, t.PkgPath(), Dialect(d), drivers.Packages[d])
		}
	}
	return DialectAuto, nil, fmt.Errorf("%w: sqltable: cannot tell the SQL dialect of driver %T; use WithDialect (and import the dialect's driver package)", locker.ErrInvalidOption, db.Driver())
}

// dialectDriver returns the registered driver of dialect d, or an error
// naming the package to import.
func dialectDriver(d Dialect) (*drivers.Driver, error) {
	if drv := drivers.Lookup(int(d)); drv != nil {
		return drv, nil
	}
	return nil, fmt.Errorf("%w: sqltable: dialect %s (WithDialect) is in a package this program does not import: import _ %q (forgotten import?)", locker.ErrInvalidOption, d, drivers.Packages[int(d)])
}

// identRE is one SQL identifier we accept unquoted-looking: ASCII letters,
// digits and underscores, not starting with a digit. Quoting keeps its case.
var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// maxTableName leaves room for the "_meta" suffix within PostgreSQL's 63-byte
// identifiers (MySQL allows 64).
const maxTableName = 58

// DefaultTable is the name of the lock table when WithTable is not given.
const DefaultTable = "locker_locks"

// tableName is a validated table name, optionally schema-qualified.
type tableName struct {
	schema, name string
}

func parseTable(s string) (tableName, error) {
	var t tableName
	parts := strings.Split(s, ".")
	switch len(parts) {
	case 1:
		t.name = parts[0]
	case 2:
		t.schema, t.name = parts[0], parts[1]
	default:
		return t, fmt.Errorf("%w: sqltable: table name %q: at most one '.' (schema.table)", locker.ErrInvalidOption, s)
	}
	for _, p := range parts {
		if !identRE.MatchString(p) || len(p) > maxTableName {
			return t, fmt.Errorf("%w: sqltable: table name %q: each part must be 1 to %d ASCII letters, digits or underscores, not starting with a digit", locker.ErrInvalidOption, s, maxTableName)
		}
	}
	return t, nil
}

func (t tableName) String() string {
	if t.schema == "" {
		return t.name
	}
	return t.schema + "." + t.name
}

// quoted returns the table's name, with suffix appended, quoted for d.
func (t tableName) quoted(d Dialect, suffix string) string {
	q := func(s string) string {
		if d == MySQL {
			return "`" + s + "`"
		}
		return `"` + s + `"`
	}
	if t.schema == "" {
		return q(t.name + suffix)
	}
	return q(t.schema) + "." + q(t.name+suffix)
}

// channel is the PostgreSQL LISTEN/NOTIFY channel of the table: a fixed
// length name derived from it, as a table name may be schema-qualified and
// close to the identifier limit.
func (t tableName) channel() string {
	h := fnv.New64a()
	h.Write([]byte(t.String()))
	return fmt.Sprintf("locker_sqltable_%016x", h.Sum64())
}

// statements are the SQL of one Locker, built once for its dialect and table.
type statements struct {
	// acquire takes key for owner with a lease of ttl microseconds if it is
	// free or its lease has run out. PostgreSQL, SQLite: returns the token,
	// no row when the key is held. MySQL: affects 1 or 2 rows when taken,
	// and the token is the last insert ID.
	acquire string
	// renew extends the lease of key when owner and token still hold it and
	// the lease has not run out; one row affected means it did.
	renew string
	// release frees key when owner and token still hold it and the lease has
	// not run out; one row affected means it did (PostgreSQL: a SELECT of
	// pg_notify over the updated row, which notifies the table's channel;
	// its rows affected count the same).
	release string
	// drop frees key when owner holds it, whatever the token or lease: the
	// clean-up of an acquire whose outcome is unknown.
	//
	// Release and drop set owner to '' and expires_us to the database's
	// now (never 0): the row keeps the time it was last in use, which Prune
	// goes by; acquire takes a row with an empty owner whatever its
	// expires_us says.
	drop string
	// remaining returns the microseconds left of key's lease (0 or negative
	// when it has run out or the row was released), no row when key has no
	// row.
	remaining string
	// inspect returns the token and the microseconds left of key's lease
	// (0 or negative when it has run out or the row was released), no row
	// when key has no row.
	inspect string
	// prune deletes the rows whose lease ran out (or that were released)
	// more than the given microseconds ago and whose token is below the
	// database's now minus the same microseconds, so that a new row's first
	// token (the database's now) is above every pruned one; at most the
	// given number of rows (see pruneBatch). MySQL: instead, it selects the
	// keys of such rows without locking them, and pruneKeys deletes them.
	prune string
	// pruneKeys (MySQL) deletes the rows of the keys listed in place of %s
	// that still qualify; it takes the microseconds twice after the keys.
	pruneKeys string
	// version reads the schema version from the meta table.
	version string
	// ddl creates the tables if missing and records the version.
	ddl []string
}

// nowMicros is the database's clock in microseconds since the Unix epoch,
// for each dialect: the only clock the lock table uses.
func nowMicros(d Dialect) string {
	switch d {
	case PostgreSQL:
		// now() is the start of the (one-statement) transaction.
		return "(extract(epoch from now()) * 1000000)::bigint"
	case MySQL:
		// UTC_TIMESTAMP(6) is the statement's start, independent of the
		// session's time zone.
		return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
	default:
		// 'subsec' (SQLite 3.42): milliseconds, stable within a statement.
		return "CAST(unixepoch('subsec') * 1000000 AS INTEGER)"
	}
}

// SchemaVersion is the version of the lock table's layout that this release
// creates and expects, recorded in the meta table (see the package
// documentation).
const SchemaVersion = 1

// newStatements writes the statements of dialect d on table t. It is over
// 100 lines because it is a table: the text of each statement in each of
// the three dialects, side by side, with why each is written as it is;
// split up, one dialect's statements could no longer be read against the
// others'.
func newStatements(d Dialect, t tableName) statements {
	tbl, meta := t.quoted(d, ""), t.quoted(d, "_meta")
	now := nowMicros(d)
	var s statements
	switch d {
	case PostgreSQL:
		s.acquire = fmt.Sprintf(`INSERT INTO %[1]s AS l (lock_key, owner, token, expires_us)
VALUES ($1, $2, %[2]s, %[2]s + $3)
ON CONFLICT (lock_key) DO UPDATE
SET owner = excluded.owner, token = GREATEST(l.token + 1, excluded.token), expires_us = excluded.expires_us
WHERE l.expires_us <= excluded.token OR l.owner = ''
RETURNING l.token`, tbl, now)
		s.renew = fmt.Sprintf(`UPDATE %[1]s SET expires_us = %[2]s + $1
WHERE lock_key = $2 AND owner = $3 AND token = $4 AND expires_us > %[2]s`, tbl, now)
		s.release = fmt.Sprintf(`WITH r AS (UPDATE %[1]s SET owner = '', expires_us = %[2]s
WHERE lock_key = $1 AND owner = $2 AND token = $3 AND expires_us > %[2]s RETURNING lock_key)
SELECT pg_notify('%[3]s', $2 || ':' || lock_key) FROM r`, tbl, now, t.channel())
		s.drop = fmt.Sprintf(`WITH r AS (UPDATE %[1]s SET owner = '', expires_us = %[3]s WHERE lock_key = $1 AND owner = $2 RETURNING lock_key)
SELECT pg_notify('%[2]s', $2 || ':' || lock_key) FROM r`, tbl, t.channel(), now)
		s.remaining = fmt.Sprintf(`SELECT CASE WHEN owner = '' THEN 0 ELSE expires_us - %[2]s END FROM %[1]s WHERE lock_key = $1`, tbl, now)
		s.inspect = fmt.Sprintf(`SELECT token, CASE WHEN owner = '' THEN 0 ELSE expires_us - %[2]s END, owner FROM %[1]s WHERE lock_key = $1`, tbl, now)
		// The rows are locked as they are chosen, and rows that another
		// statement has locked (an acquire of that key) are skipped; the
		// outer condition is checked again on the locked row.
		s.prune = fmt.Sprintf(`DELETE FROM %[1]s WHERE lock_key IN (
	SELECT lock_key FROM %[1]s WHERE expires_us < %[2]s - $1 AND token < %[2]s - $1
	ORDER BY lock_key LIMIT $2 FOR UPDATE SKIP LOCKED)
AND expires_us < %[2]s - $1 AND token < %[2]s - $1`, tbl, now)
		s.version = fmt.Sprintf(`SELECT value FROM %s WHERE name = 'schema_version'`, meta)
		s.ddl = []string{
			fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	lock_key   text COLLATE "C" PRIMARY KEY,
	owner      text NOT NULL,
	token      bigint NOT NULL,
	expires_us bigint NOT NULL
)`, tbl),
			fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (name text PRIMARY KEY, value text NOT NULL)`, meta),
			fmt.Sprintf(`INSERT INTO %s (name, value) VALUES ('schema_version', '%d') ON CONFLICT (name) DO NOTHING`, meta, SchemaVersion),
		}
	case MySQL:
		// No RETURNING, no WHERE on ON DUPLICATE KEY UPDATE: the
		// assignments run left to right, each seeing the columns already
		// assigned. owner changes first, only when the lease has run out;
		// after it, "owner = VALUES(owner)" holds exactly when this
		// statement took the key (owners are random and never reused), and
		// the token and expiry follow it. A try that finds the key held
		// assigns every column its own value: InnoDB writes nothing and
		// reports 0 rows affected. LAST_INSERT_ID(expr) hands the token to
		// the client in the OK packet, without a second round trip.
		s.acquire = fmt.Sprintf(`INSERT INTO %[1]s (lock_key, owner, token, expires_us)
VALUES (?, ?, LAST_INSERT_ID(%[2]s), %[2]s + ?)
ON DUPLICATE KEY UPDATE
owner = IF(expires_us <= %[2]s OR owner = '', VALUES(owner), owner),
token = IF(owner = VALUES(owner), LAST_INSERT_ID(GREATEST(token + 1, VALUES(token))), token),
expires_us = IF(owner = VALUES(owner), VALUES(expires_us), expires_us)`, tbl, now)
		s.renew = fmt.Sprintf(`UPDATE %[1]s SET expires_us = %[2]s + ?
WHERE lock_key = ? AND owner = ? AND token = ? AND expires_us > %[2]s`, tbl, now)
		s.release = fmt.Sprintf(`UPDATE %[1]s SET owner = '', expires_us = %[2]s
WHERE lock_key = ? AND owner = ? AND token = ? AND expires_us > %[2]s`, tbl, now)
		s.drop = fmt.Sprintf("UPDATE %[1]s SET owner = '', expires_us = %[2]s WHERE lock_key = ? AND owner = ?", tbl, now)
		s.remaining = fmt.Sprintf(`SELECT CASE WHEN owner = '' THEN 0 ELSE expires_us - %[2]s END FROM %[1]s WHERE lock_key = ?`, tbl, now)
		s.inspect = fmt.Sprintf(`SELECT token, CASE WHEN owner = '' THEN 0 ELSE expires_us - %[2]s END, owner FROM %[1]s WHERE lock_key = ?`, tbl, now)
		// Two statements: the columns of the condition have no index, and
		// under REPEATABLE READ a DELETE locks every row it scans, so one
		// DELETE ... LIMIT would lock most of the table while few rows
		// qualify. The SELECT is a consistent read and locks nothing; the
		// DELETE finds its rows by primary key and checks them again. Each
		// SELECT goes on from the last key of the one before (keyset
		// paging), so the table is read once, not once per batch.
		s.prune = fmt.Sprintf(`SELECT lock_key FROM %[1]s WHERE expires_us < %[2]s - ? AND token < %[2]s - ? AND lock_key > ? ORDER BY lock_key LIMIT ?`, tbl, now)
		s.pruneKeys = fmt.Sprintf(`DELETE FROM %[1]s WHERE lock_key IN (%%s) AND expires_us < %[2]s - ? AND token < %[2]s - ?`, tbl, now)
		s.version = fmt.Sprintf("SELECT value FROM %s WHERE name = 'schema_version'", meta)
		s.ddl = []string{
			fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (\n"+
				"\tlock_key   VARBINARY(1024) NOT NULL PRIMARY KEY,\n"+
				"\towner      VARBINARY(255) NOT NULL,\n"+
				"\ttoken      BIGINT NOT NULL,\n"+
				"\texpires_us BIGINT NOT NULL\n"+
				") ENGINE=InnoDB ROW_FORMAT=DYNAMIC", tbl),
			fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (name VARCHAR(64) NOT NULL PRIMARY KEY, value VARCHAR(64) NOT NULL) ENGINE=InnoDB", meta),
			fmt.Sprintf("INSERT IGNORE INTO %s (name, value) VALUES ('schema_version', '%d')", meta, SchemaVersion),
		}
	case SQLite:
		s.acquire = fmt.Sprintf(`INSERT INTO %[1]s AS l (lock_key, owner, token, expires_us)
VALUES (?1, ?2, %[2]s, %[2]s + ?3)
ON CONFLICT (lock_key) DO UPDATE
SET owner = excluded.owner, token = max(l.token + 1, excluded.token), expires_us = excluded.expires_us
WHERE l.expires_us <= excluded.token OR l.owner = ''
RETURNING token`, tbl, now)
		s.renew = fmt.Sprintf(`UPDATE %[1]s SET expires_us = %[2]s + ?1
WHERE lock_key = ?2 AND owner = ?3 AND token = ?4 AND expires_us > %[2]s`, tbl, now)
		s.release = fmt.Sprintf(`UPDATE %[1]s SET owner = '', expires_us = %[2]s
WHERE lock_key = ?1 AND owner = ?2 AND token = ?3 AND expires_us > %[2]s`, tbl, now)
		s.drop = fmt.Sprintf(`UPDATE %[1]s SET owner = '', expires_us = %[2]s WHERE lock_key = ?1 AND owner = ?2`, tbl, now)
		s.remaining = fmt.Sprintf(`SELECT CASE WHEN owner = '' THEN 0 ELSE expires_us - %[2]s END FROM %[1]s WHERE lock_key = ?1`, tbl, now)
		s.inspect = fmt.Sprintf(`SELECT token, CASE WHEN owner = '' THEN 0 ELSE expires_us - %[2]s END, owner FROM %[1]s WHERE lock_key = ?1`, tbl, now)
		s.prune = fmt.Sprintf(`DELETE FROM %[1]s WHERE lock_key IN (
	SELECT lock_key FROM %[1]s WHERE expires_us < %[2]s - ?1 AND token < %[2]s - ?1
	ORDER BY lock_key LIMIT ?2)`, tbl, now)
		s.version = fmt.Sprintf(`SELECT value FROM %s WHERE name = 'schema_version'`, meta)
		s.ddl = []string{
			fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	lock_key   TEXT NOT NULL PRIMARY KEY,
	owner      TEXT NOT NULL,
	token      INTEGER NOT NULL,
	expires_us INTEGER NOT NULL
) WITHOUT ROWID`, tbl),
			fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (name TEXT PRIMARY KEY, value TEXT NOT NULL)`, meta),
			fmt.Sprintf(`INSERT OR IGNORE INTO %s (name, value) VALUES ('schema_version', '%d')`, meta, SchemaVersion),
		}
	}
	return s
}

// DDL returns the statements that create the lock table, its meta table
// and the families table (semaphores and reader-writer locks) for dialect d (PostgreSQL, MySQL or SQLite) under the given table name, as
// the Locker runs them unless WithoutDDL is given: for users who manage
// schemas themselves.
func DDL(d Dialect, table string) ([]string, error) {
	t, err := parseTable(table)
	if err != nil {
		return nil, err
	}
	if d != PostgreSQL && d != MySQL && d != SQLite {
		return nil, errors.New("sqltable: DDL needs a dialect: PostgreSQL, MySQL or SQLite")
	}
	return append(newStatements(d, t).ddl, newFamStatements(d, t).ddl...), nil
}
