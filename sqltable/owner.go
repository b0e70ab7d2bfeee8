package sqltable

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"unicode/utf8"
)

// A holder's locker.WithOwner description is kept in the owner column, after
// the random owner token and a space: "<owner token> <description>". The
// whole is what renewal and release compare, as before, so the description
// costs no statement and no column of its own, and tables of earlier
// releases keep working. Inspect reports what follows the first space (the
// owner token is base64url, without one).

// ownerTokenLen is the length of lease.NewOwner's tokens, plus the space.
const ownerTokenLen = 22 + 1

// mysqlOwnerWidth is the owner column's width on MySQL/MariaDB in the
// tables this release creates, and the width init widens an earlier
// release's VARBINARY(64) to (unless WithoutDDL): room for an owner token
// and a description of 232 bytes. 255 keeps the column's one length byte,
// so the change is made in place, without copying the table.
const mysqlOwnerWidth = 255

// ownerValue is the owner column's value for a fresh owner token and the
// holder's description desc, cut (at a character boundary) to what the
// column has room for (see ownerRoom).
func (l *Locker) ownerValue(owner, desc string) string {
	if desc == "" {
		return owner
	}
	if l.ownerRoom >= 0 && len(desc) > l.ownerRoom {
		desc = truncateUTF8(desc, l.ownerRoom)
		if desc == "" {
			return owner
		}
	}
	return owner + " " + desc
}

// ownerDescription is the description in an owner column's value, or "".
func ownerDescription(v string) string {
	_, desc, _ := strings.Cut(v, " ")
	return desc
}

// truncateUTF8 cuts s to at most n bytes without splitting a character.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// checkOwnerRoom sets ownerRoom: how many bytes of a description the owner
// column holds. Unbounded (-1) on PostgreSQL and SQLite (text). On MySQL
// the column is VARBINARY(n), and a longer value would fail the statement
// (or, outside strict mode, be cut and never match again): init reads n
// and, when it is below mysqlOwnerWidth and DDL is allowed, widens it.
// With WithoutDDL, or a role that may not alter the table, a narrower
// column stays, and descriptions are cut to fit.
func (l *Locker) checkOwnerRoom(ctx context.Context) error {
	l.ownerRoom = -1
	if l.dialect != MySQL {
		return nil
	}
	width, err := l.mysqlOwnerWidth(ctx)
	if err != nil {
		return err
	}
	if width < mysqlOwnerWidth && !l.cfg.NoDDL {
		alter := fmt.Sprintf("ALTER TABLE %s MODIFY owner VARBINARY(%d) NOT NULL", l.table.quoted(MySQL, ""), mysqlOwnerWidth)
		// A role without ALTER keeps the narrow column: descriptions are
		// cut to fit, and locking works as before.
		if err := l.retry(ctx, func(ctx context.Context) error {
			_, err := l.db.ExecContext(ctx, alter)
			return err
		}); err == nil {
			if width, err = l.mysqlOwnerWidth(ctx); err != nil {
				return err
			}
		}
	}
	l.ownerRoom = max(width-ownerTokenLen, 0)
	return nil
}

// mysqlOwnerWidth reads the owner column's width from information_schema.
func (l *Locker) mysqlOwnerWidth(ctx context.Context) (int, error) {
	var width sql.NullInt64
	err := l.retry(ctx, func(ctx context.Context) error {
		return l.db.QueryRowContext(ctx, `SELECT CHARACTER_MAXIMUM_LENGTH FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND COLUMN_NAME = 'owner'`, l.table.schema, l.table.name).Scan(&width)
	})
	if err != nil {
		return 0, fmt.Errorf("sqltable: read the width of %s.owner: %w", l.table, err)
	}
	return int(width.Int64), nil
}
