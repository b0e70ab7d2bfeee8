package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

var _ locker.Inspector = (*Locker)(nil)

// gucApp is the setting through which a holding session tells others its
// token and description (see ownerSetting).
const gucApp = "application_name"

// sqlInspect finds the session that holds the advisory lock whose bigint
// key has the given halves, in this database, and its application_name.
const sqlInspect = `SELECT COALESCE(a.application_name, '') FROM pg_catalog.pg_locks l
		LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1::bigint::oid AND l.objid = $2::bigint::oid AND l.objsubid = 1
		AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
		LIMIT 1`

// withOwner returns t with application_name among the settings of the
// holding session: the mutex's lock statements set it to "locker <token>
// <desc, escaped>" when they grant the lock (see sqlSettingValue), and the
// unlock sets it back, as the lease's settings.
func (t terms) withOwner(desc string) terms {
	if len(t.names) == 1 && t.names[0] == gucIdle {
		t.names = namesIdleApp
		t.values = []string{t.values[0], escapeOwner(desc)}
		return t
	}
	t.names = append(slices.Clip(t.names), gucApp)
	t.values = append(slices.Clip(t.values), escapeOwner(desc))
	return t
}

// mutex14 reports whether t's settings are exactly those of the mutex on
// PostgreSQL 14+, idle_session_timeout and application_name (termsFor and
// withOwner make them in that order), which sqlLockWait14, sqlLockTry14
// and sqlUnlock14 name themselves.
func (t terms) mutex14() bool {
	return len(t.names) == 2 && t.names[0] == gucIdle && t.names[1] == gucApp
}

// escapeOwner makes desc printable ASCII, which application_name keeps as
// it is on every server version (others replace the rest with '?' or
// \x escapes): bytes outside ' '..'~', and '%', become %XX.
func escapeOwner(desc string) string {
	clean := true
	for i := 0; i < len(desc) && clean; i++ {
		clean = !needsEscape(desc[i])
	}
	if clean {
		return desc // without the heap allocation of b below
	}
	var b strings.Builder
	for i := 0; i < len(desc); i++ {
		c := desc[i]
		if needsEscape(c) {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// needsEscape reports a byte that escapeOwner escapes.
func needsEscape(c byte) bool { return c < ' ' || c > '~' || c == '%' }

// unescapeOwner undoes escapeOwner; an escape cut short by the server's
// truncation of application_name is dropped, and a character cut in the
// middle too.
func unescapeOwner(s string) string {
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b = append(b, s[i])
			continue
		}
		if i+2 >= len(s) {
			break
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			break
		}
		b = append(b, byte(v))
		i += 2
	}
	return strings.ToValidUTF8(string(b), "")
}

// parseAppName reads the token and description of a holding session's
// application_name ("locker <token>[ <escaped description>]"); ok is false
// for any other.
func parseAppName(app string) (token int64, desc string, ok bool) {
	rest, found := strings.CutPrefix(app, "locker ")
	if !found {
		return 0, "", false
	}
	num, esc, _ := strings.Cut(rest, " ")
	token, err := strconv.ParseInt(num, 10, 64)
	if err != nil || token <= 0 {
		return 0, "", false
	}
	return token, unescapeOwner(esc), true
}

// Inspect reports whether another session (or this Locker's) holds key's
// mutex, from pg_locks, and the holder's token and locker.WithOwner
// description from its session's application_name in pg_stat_activity,
// which the statement that granted the lock set to "locker <token>
// <description>" (and the unlock sets back). It reads one row on a
// connection of the pool, takes nothing and changes nothing.
//
// What it cannot tell: TTL and Lease are 0 (the lease is the holding
// session's idle_session_timeout, which other sessions cannot read);
// pg_stat_activity shows 63 bytes of application_name, so a description
// longer than about 50 bytes is cut (non-ASCII bytes take three: they are
// %-escaped), at a character's end; and a lock held by other software, by
// LockTx, or in the instant between the grant and the setting, shows as
// held with Token 0 and no Owner. Only the mutex: Inspect does not see the
// lock families' keys.
func (l *Locker) Inspect(ctx context.Context, key string) (locker.LockInfo, error) {
	const op = "inspect"
	info := locker.LockInfo{Key: key}
	ctx, done, err := l.life.Enter(ctx, op, key)
	if err != nil {
		return info, err
	}
	defer done()
	hi, lo := keyHalves(AdvisoryKey(l.cfg.Prefix, key))
	var app string
	err = l.pool.QueryRow(ctx, sqlInspect, hi, lo).Scan(&app)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return info, nil
	case err != nil:
		return info, l.why(ctx, op, key, backend.KeyError(op, key, fmt.Errorf("reading pg_locks: %w", err)))
	}
	info.Held = true
	if token, desc, ok := parseAppName(app); ok {
		if info.Token, err = l.cfg.Token(token); err != nil {
			return locker.LockInfo{Key: key}, backend.KeyError(op, key, err)
		}
		info.Owner = desc
	}
	return info, nil
}
