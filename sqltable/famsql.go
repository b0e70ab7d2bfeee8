package sqltable

import (
	"fmt"
	"regexp"
	"strconv"
)

// The families table: the semaphores' and reader-writer locks' queues (see
// "Semaphores and reader-writer locks" in the package documentation).
//
// Each key of a family has a queue of rows in the table "<table>_fam",
// ordered by seq: its head row (seq 0: the key's counter and row lock),
// then a row per holder and per waiter. A row of family f, key k and kind m
// is admitted (may hold) when fewer than lim of the rows ahead of it
// conflict with it: for a permit (lim n) every row ahead conflicts, for a
// writer (lim 1) too, for a reader (lim 1) only the writers. So the n
// oldest rows of a semaphore hold its permits, and the readers ahead of a
// reader-writer key's first writer hold it together. Waiting rows are
// granted in order as they come within reach: first come, first served.

// The families and the kinds of their rows, as the table stores them.
const (
	famRW  = 1 // reader-writer locks
	famSem = 2 // semaphores

	kindRead   = 1
	kindWrite  = 2
	kindPermit = 3
)

// famSuffix names the families table: the lock table's name with it
// appended, as "_meta" names the meta table (both within the 63 bytes of a
// PostgreSQL identifier for a table name of up to maxTableName bytes).
const famSuffix = "_fam"

// famNowPostgres is the families' statements' clock on PostgreSQL (see
// newFamStatements).
const famNowPostgres = "(extract(epoch from clock_timestamp()) * 1000000)::bigint"

// FamiliesVersion is the version of the families table's layout that this
// release creates and expects, recorded in the meta table's
// families_version row. (The lock table's own layout, SchemaVersion, is
// unchanged: releases without lock families share the table with this one.)
const FamiliesVersion = 1

// fstmt is one statement of the families, written with $n parameters, in
// the dialect's form: text, and for MySQL, whose ? parameters are
// positional, the index of the argument of each ?.
type fstmt struct {
	text  string
	order []int
}

var paramRE = regexp.MustCompile(`\$(\d+)`)

// famStmt writes q (with $1, $2, ... parameters) in dialect d.
func famStmt(d Dialect, q string) fstmt {
	switch d {
	case SQLite:
		return fstmt{text: paramRE.ReplaceAllString(q, "?$1")}
	case MySQL:
		var order []int
		text := paramRE.ReplaceAllStringFunc(q, func(m string) string {
			n, _ := strconv.Atoi(m[1:])
			order = append(order, n-1)
			return "?"
		})
		return fstmt{text: text, order: order}
	default:
		return fstmt{text: q}
	}
}

// args puts the arguments of $1, $2, ... in the order the statement takes
// them.
func (s fstmt) args(a ...any) []any {
	if s.order == nil {
		return a
	}
	out := make([]any, len(s.order))
	for i, j := range s.order {
		out[i] = a[j]
	}
	return out
}

// famStatements are the statements of the families table.
type famStatements struct {
	// head locks the key's head row (inserting it if missing) for the rest
	// of the transaction and takes the next value of the key's counter:
	// max(last + 1, the database's now in microseconds). Every row is
	// queued, and every grant made, under it, so the seqs of a key follow
	// the order in which its rows were queued, and its tokens the order of
	// its grants. Args: family, key (PostgreSQL: and the longest the
	// transaction may then sit idle, in milliseconds). PostgreSQL, SQLite:
	// returns the value; MySQL: the last insert ID.
	head fstmt
	// gc deletes the key's rows whose lease has run out, under the head's
	// lock: a row that an admission counts as gone is gone, and a late
	// renewal cannot bring it back. Args: family, key.
	gc fstmt
	// check reads, for a new row of kind and lim, the limit of the key's
	// rows when it differs from lim (0 if none differs), how many of its
	// rows conflict with the new one, how long until the first of them
	// runs out, and how many have run out (for gc). Args: family, key,
	// lim, kind.
	check fstmt
	// insert queues a row. Args: family, key, seq, owner, kind, lim, token
	// (0 while waiting), lease in microseconds.
	insert fstmt
	// state reads a waiting row: its token, how many rows ahead of it
	// conflict with it (all of them; and those whose lease has not run
	// out), its lim, how long until the first row ahead that has not run
	// out runs out, how many rows of the key have run out (for gc), and the
	// row to wait for (its seq; 0 if none): the nearest conflicting row
	// ahead for a reader or a writer, the oldest for a permit. No row when
	// it is gone. Args: family, key, seq, owner.
	state fstmt
	// extend extends the wait of a waiting row whose wait has not run out,
	// without the head lock. Args: family, key, seq, owner, lease in
	// microseconds.
	extend fstmt
	// set grants a waiting row (token) or extends its wait (token 0).
	// Args: family, key, seq, owner, token, lease in microseconds.
	set fstmt
	// renew extends a holder's lease if its row still holds and has not
	// run out. Args: lease, family, key, seq, owner, token.
	renew fstmt
	// release deletes a holder's row if it still holds and has not run
	// out. Args: family, key, seq, owner, token.
	release fstmt
	// drop deletes the row of owner, holder or waiter, whatever its token
	// or lease. Args: family, key, owner.
	drop fstmt
	// wake returns the owners of the key's waiting rows that are admitted
	// now (PostgreSQL: and notifies them on the table's channel, "!owner").
	// Args: family, key.
	wake fstmt
	// version reads the families table's version from the meta table.
	version string
	// ddl creates the families table if missing and records its version.
	ddl []string
}

// newFamStatements writes the families' statements of dialect d on the
// families table of t.
func newFamStatements(d Dialect, t tableName) famStatements {
	tbl, meta := t.quoted(d, famSuffix), t.quoted(d, "_meta")
	now := nowMicros(d)
	if d == PostgreSQL {
		// The clock when the statement runs, not when its transaction
		// began (now()): a grant made after a wait for the head lock has
		// its whole lease on the database.
		now = famNowPostgres
	}
	cols := "(family, lock_key, seq, owner, kind, lim, token, expires_us)"
	var s famStatements
	switch d {
	case MySQL:
		// LAST_INSERT_ID(expr) hands the counter back in the OK packet.
		s.head = famStmt(d, fmt.Sprintf(`INSERT INTO %[1]s %[3]s VALUES ($1, $2, 0, '', 0, 0, LAST_INSERT_ID(%[2]s), %[2]s)
ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token + 1, VALUES(token))), expires_us = VALUES(expires_us)`, tbl, now, cols))
	case PostgreSQL:
		// set_config(..., true) is SET LOCAL: a client that goes silent
		// in the transaction (a partition) holds the head lock no longer
		// than $3 milliseconds (the lease asked), after which the server
		// ends its session and the lock with it.
		s.head = famStmt(d, fmt.Sprintf(`WITH c AS (SELECT set_config('idle_in_transaction_session_timeout', $3, true))
INSERT INTO %[1]s AS h %[3]s SELECT $1, $2, 0, '', 0, 0, %[2]s, %[2]s FROM c
ON CONFLICT (family, lock_key, seq) DO UPDATE SET token = GREATEST(h.token + 1, excluded.token), expires_us = excluded.expires_us
RETURNING h.token`, tbl, now, cols))
	case SQLite:
		s.head = famStmt(d, fmt.Sprintf(`INSERT INTO %[1]s AS h %[3]s VALUES ($1, $2, 0, '', 0, 0, %[2]s, %[2]s)
ON CONFLICT (family, lock_key, seq) DO UPDATE SET token = max(h.token + 1, excluded.token), expires_us = excluded.expires_us
RETURNING token`, tbl, now, cols))
	}
	s.gc = famStmt(d, fmt.Sprintf(`DELETE FROM %[1]s WHERE family = $1 AND lock_key = $2 AND seq > 0 AND expires_us <= %[2]s`, tbl, now))
	s.check = famStmt(d, fmt.Sprintf(`SELECT COALESCE(MAX(CASE WHEN lim <> $3 THEN lim END), 0),
	COUNT(CASE WHEN $4 <> %[3]d OR kind = %[4]d THEN 1 END),
	COALESCE(MIN(expires_us), %[2]s) - %[2]s,
	COUNT(CASE WHEN expires_us <= %[2]s THEN 1 END)
FROM %[1]s WHERE family = $1 AND lock_key = $2 AND seq > 0`, tbl, now, kindRead, kindWrite))
	s.insert = famStmt(d, fmt.Sprintf(`INSERT INTO %[1]s %[3]s VALUES ($1, $2, $3, $4, $5, $6, $7, %[2]s + $8)`, tbl, now, cols))
	// ahead counts the rows ahead of a that conflict with it; live limits
	// them to those whose lease has not run out.
	ahead := func(live bool) string {
		q := fmt.Sprintf(`SELECT COUNT(*) FROM %[1]s b WHERE b.family = a.family AND b.lock_key = a.lock_key AND b.seq > 0 AND b.seq < a.seq
	AND (a.kind <> %[2]d OR b.kind = %[3]d)`, tbl, kindRead, kindWrite)
		if live {
			q += " AND b.expires_us > " + now
		}
		return q
	}
	s.state = famStmt(d, fmt.Sprintf(`SELECT a.token, (%[3]s), (%[4]s), a.lim,
	COALESCE((SELECT MIN(b.expires_us) FROM %[1]s b WHERE b.family = a.family AND b.lock_key = a.lock_key AND b.seq > 0 AND b.seq < a.seq AND b.expires_us > %[2]s), %[2]s) - %[2]s,
	(SELECT COUNT(*) FROM %[1]s b WHERE b.family = a.family AND b.lock_key = a.lock_key AND b.seq > 0 AND b.expires_us <= %[2]s),
	COALESCE((SELECT CASE WHEN a.kind = %[5]d THEN MIN(b.seq) ELSE MAX(b.seq) END FROM %[1]s b
		WHERE b.family = a.family AND b.lock_key = a.lock_key AND b.seq > 0 AND b.seq < a.seq AND b.expires_us > %[2]s
		AND (a.kind <> %[6]d OR b.kind = %[7]d)), 0)
FROM %[1]s a WHERE a.family = $1 AND a.lock_key = $2 AND a.seq = $3 AND a.owner = $4`, tbl, now, ahead(false), ahead(true), kindPermit, kindRead, kindWrite))
	s.extend = famStmt(d, fmt.Sprintf(`UPDATE %[1]s SET expires_us = %[2]s + $5
WHERE family = $1 AND lock_key = $2 AND seq = $3 AND owner = $4 AND token = 0 AND expires_us > %[2]s`, tbl, now))
	s.set = famStmt(d, fmt.Sprintf(`UPDATE %[1]s SET token = $5, expires_us = %[2]s + $6
WHERE family = $1 AND lock_key = $2 AND seq = $3 AND owner = $4`, tbl, now))
	s.renew = famStmt(d, fmt.Sprintf(`UPDATE %[1]s SET expires_us = %[2]s + $1
WHERE family = $2 AND lock_key = $3 AND seq = $4 AND owner = $5 AND token = $6 AND expires_us > %[2]s`, tbl, now))
	s.release = famStmt(d, fmt.Sprintf(`DELETE FROM %[1]s
WHERE family = $1 AND lock_key = $2 AND seq = $3 AND owner = $4 AND token = $5 AND expires_us > %[2]s`, tbl, now))
	s.drop = famStmt(d, fmt.Sprintf(`DELETE FROM %[1]s WHERE family = $1 AND lock_key = $2 AND seq > 0 AND owner = $3`, tbl))
	sel := "a.owner"
	if d == PostgreSQL {
		sel = fmt.Sprintf(`a.owner, pg_notify('%s', '!' || a.owner)`, t.channel())
	}
	s.wake = famStmt(d, fmt.Sprintf(`SELECT %[4]s FROM %[1]s a
WHERE a.family = $1 AND a.lock_key = $2 AND a.seq > 0 AND a.token = 0 AND a.expires_us > %[2]s AND (%[3]s) < a.lim`, tbl, now, ahead(true), sel))
	s.version = fmt.Sprintf(`SELECT value FROM %s WHERE name = 'families_version'`, meta)
	switch d {
	case PostgreSQL:
		s.ddl = []string{
			fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	family     integer NOT NULL,
	lock_key   text COLLATE "C" NOT NULL,
	seq        bigint NOT NULL,
	owner      text NOT NULL,
	kind       integer NOT NULL,
	lim        integer NOT NULL,
	token      bigint NOT NULL,
	expires_us bigint NOT NULL,
	PRIMARY KEY (family, lock_key, seq)
)`, tbl),
			fmt.Sprintf(`INSERT INTO %s (name, value) VALUES ('families_version', '%d') ON CONFLICT (name) DO NOTHING`, meta, FamiliesVersion),
		}
	case MySQL:
		s.ddl = []string{
			fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (\n"+
				"\tfamily     INT NOT NULL,\n"+
				"\tlock_key   VARBINARY(1024) NOT NULL,\n"+
				"\tseq        BIGINT NOT NULL,\n"+
				"\towner      VARBINARY(64) NOT NULL,\n"+
				"\tkind       INT NOT NULL,\n"+
				"\tlim        INT NOT NULL,\n"+
				"\ttoken      BIGINT NOT NULL,\n"+
				"\texpires_us BIGINT NOT NULL,\n"+
				"\tPRIMARY KEY (family, lock_key, seq)\n"+
				") ENGINE=InnoDB ROW_FORMAT=DYNAMIC", tbl),
			fmt.Sprintf("INSERT IGNORE INTO %s (name, value) VALUES ('families_version', '%d')", meta, FamiliesVersion),
		}
	case SQLite:
		s.ddl = []string{
			fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	family     INTEGER NOT NULL,
	lock_key   TEXT NOT NULL,
	seq        INTEGER NOT NULL,
	owner      TEXT NOT NULL,
	kind       INTEGER NOT NULL,
	lim        INTEGER NOT NULL,
	token      INTEGER NOT NULL,
	expires_us INTEGER NOT NULL,
	PRIMARY KEY (family, lock_key, seq)
) WITHOUT ROWID`, tbl),
			fmt.Sprintf(`INSERT OR IGNORE INTO %s (name, value) VALUES ('families_version', '%d')`, meta, FamiliesVersion),
		}
	}
	return s
}
