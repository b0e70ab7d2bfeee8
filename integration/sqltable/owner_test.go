package sqltable_test

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/sqltable"
)

// TestOwnerColumnOfEarlierRelease: a MySQL lock table made by an earlier
// release, whose owner column is VARBINARY(64), keeps working with holders'
// descriptions: with WithoutDDL they are cut to what the column holds and
// locks are taken and released as before; without it the Locker widens the
// column, and whole descriptions come back from Inspect.
func TestOwnerColumnOfEarlierRelease(t *testing.T) {
	d := dialects[2]
	admin := d.admin(t)
	ctx := testCtx(t)
	table := fmt.Sprintf("owner_old_%d", time.Now().UnixNano())
	stmts, err := sqltable.DDL(sqltable.MySQL, table)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range append(stmts, "ALTER TABLE `"+table+"` MODIFY owner VARBINARY(64) NOT NULL") {
		if _, err := admin.ExecContext(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	t.Cleanup(func() {
		for _, s := range []string{"", "_meta", "_fam"} {
			_, _ = admin.Exec("DROP TABLE IF EXISTS `" + table + s + "`")
		}
	})
	width := func() int {
		var w int
		if err := admin.QueryRowContext(ctx, `SELECT CHARACTER_MAXIMUM_LENGTH FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'owner'`, table).Scan(&w); err != nil {
			t.Fatal(err)
		}
		return w
	}
	desc := "host=build-7 pid=1234 cmd=" + strings.Repeat("é", 60) // 146 bytes
	check := func(l *sqltable.Locker, want string) {
		t.Helper()
		k := testKey(t, "")
		h, err := l.TryAcquire(ctx, k, locker.WithOwner(desc))
		if err != nil {
			t.Fatalf("TryAcquire with WithOwner: %v", err)
		}
		info, err := l.Inspect(ctx, k)
		if err != nil || !info.Held || info.Owner != want {
			t.Errorf("Inspect = %+v, %v; want held, Owner %q", info, err, want)
		}
		if err := h.Release(ctx); err != nil {
			t.Errorf("Release: %v", err)
		}
		if info, err := l.Inspect(ctx, k); err != nil || info.Held {
			t.Errorf("Inspect after Release = %+v, %v; want not held", info, err)
		}
	}

	kept := open(t, d.url(t, "", url.Values{"lock_table": {table}, "ddl": {"false"}}))
	// Room for 64 - 22 (owner token) - 1 (space) = 41 bytes; byte 41 is in
	// the middle of an "é", which is left out whole.
	check(kept, desc[:40])
	if w := width(); w != 64 {
		t.Fatalf("owner column width %d after a WithoutDDL Locker, want 64 (untouched)", w)
	}

	widened := open(t, d.url(t, "", url.Values{"lock_table": {table}}))
	check(widened, desc)
	if w := width(); w != 255 {
		t.Errorf("owner column width %d after a Locker with DDL, want 255", w)
	}
}
