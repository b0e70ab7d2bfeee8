package sqltable

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/go-locker/locker"
)

// pgTempSchema matches PostgreSQL's temporary schemas, in any case (the
// table name is quoted, so "PG_TEMP" would be another schema, but nobody
// who writes it means that): pg_temp, the session's alias, and pg_temp_N
// and pg_toast_temp_N, the per-session schemas behind it.
var pgTempSchema = regexp.MustCompile(`(?i)^pg_(toast_)?temp(_[0-9]+)?$`)

// tempSchema reports whether schema is a temporary schema of d, where each
// connection has tables of its own, and names it for an error.
func tempSchema(d Dialect, schema string) (string, bool) {
	switch {
	case d == SQLite && strings.EqualFold(schema, "temp"):
		return fmt.Sprintf("SQLite's temporary schema %q", schema), true
	case d == PostgreSQL && pgTempSchema.MatchString(schema):
		return fmt.Sprintf("PostgreSQL's temporary schema %q", schema), true
	}
	return "", false
}

// checkTable refuses a table name in a temporary schema of d. MySQL has no
// temporary schema (see "Unsafe configurations" in the package
// documentation for its TEMPORARY tables).
func checkTable(d Dialect, t tableName) error {
	what, ok := tempSchema(d, t.schema)
	if !ok {
		return nil
	}
	return fmt.Errorf("%w: %w: sqltable: table %q (WithTable, URL parameter lock_table) is in %s, where each connection has a table of its own: two holders of one key would never see each other; name a table in a permanent schema", locker.ErrUnsafeConfig, locker.ErrInvalidOption, t.String(), what)
}
