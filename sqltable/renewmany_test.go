package sqltable

import (
	"strings"
	"testing"
)

// The batched renewal's statements name every lock once, with its
// dialect's placeholders in order after the lease's, and are kept per
// table and size.
func TestRenewTexts(t *testing.T) {
	for _, tc := range []struct {
		d    Dialect
		fam  bool
		want string
	}{
		{PostgreSQL, false, `UPDATE "t" SET expires_us = (extract(epoch from now()) * 1000000)::bigint + $1
WHERE lock_key IN (SELECT lock_key FROM "t" WHERE expires_us > (extract(epoch from now()) * 1000000)::bigint AND ((lock_key = $2 AND owner = $3 AND token = $4)
OR (lock_key = $5 AND owner = $6 AND token = $7)) FOR UPDATE SKIP LOCKED)
RETURNING owner`},
		{PostgreSQL, true, `UPDATE "t_fam" SET expires_us = ` + famNowPostgres + ` + $1
WHERE (family, lock_key, seq) IN (SELECT family, lock_key, seq FROM "t_fam" WHERE expires_us > ` + famNowPostgres + ` AND ((family = $2 AND lock_key = $3 AND seq = $4 AND owner = $5 AND token = $6)
OR (family = $7 AND lock_key = $8 AND seq = $9 AND owner = $10 AND token = $11)) FOR UPDATE SKIP LOCKED)
RETURNING owner`},
		{SQLite, false, "?7))\nRETURNING owner"},
		{MySQL, true, "token = ?))"},
	} {
		var r renewTexts
		tbl := `"t"`
		if tc.fam {
			tbl = `"t_fam"`
		}
		got := r.text(tc.d, tbl, tc.fam, false, 2)
		if !strings.HasSuffix(got, tc.want) {
			t.Errorf("%v fam=%t:\n%s\nwant it to end with\n%s", tc.d, tc.fam, got, tc.want)
		}
		if again := r.text(tc.d, "other", tc.fam, false, 2); again != got {
			t.Errorf("%v fam=%t: the text of 2 was not kept", tc.d, tc.fam)
		}
		if n := strings.Count(r.text(tc.d, tbl, tc.fam, false, renewMax), "\nOR ("); n != renewMax-1 {
			t.Errorf("%v fam=%t: %d ORs in the text of %d", tc.d, tc.fam, n, renewMax)
		}
	}
}
