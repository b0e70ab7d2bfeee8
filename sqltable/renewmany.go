package sqltable

import (
	"context"
	"database/sql"
	"fmt"
	"math/bits"
	"strings"
	"sync"
	"time"

	"github.com/go-locker/locker/internal/lease"
)

// Renewals in batches: the renewals that come due within a moment
// (lease.Batcher; the Handles of one TTL and one table form a group: the
// mutex's rows in the lock table, the families' in the families table) go
// out as one UPDATE of every row still held by its owner and token, with
// one lease for them all. Its rows affected tell whether every lock was still ours; when fewer
// rows were renewed than asked (a lock lost, its row changed or taken), each
// lock of the batch is renewed again on its own, which is harmless for
// those the batch renewed, and tells which one was not.
//
// The statement names each lock in an OR of primary-key equalities, which
// every dialect's planner answers with index look-ups. Its text depends on
// how many locks it names, so a batch is padded (with its last lock again)
// to a power of two: at most renewBuckets texts per Locker, each prepared
// and cached per connection by the driver, as the other statements.

// renewMax is the most renewals one statement carries (the last bucket).
const renewMax = 128

// renewBuckets is how many statement texts renewMany uses: 1, 2, 4, ... renewMax.
const renewBuckets = 8

// renewTexts builds and keeps the batched renewal's statement texts: of
// the lock table, and of the families table.
type renewTexts struct {
	mu    sync.Mutex
	texts [2][renewBuckets]string
}

// The columns that name a held row: in the lock table, and in the
// families table (whose rows are holders and waiters of one key).
var (
	renewCols    = []string{"lock_key", "owner", "token"}
	famRenewCols = []string{"family", "lock_key", "seq", "owner", "token"}
)

// text returns the statement renewing n locks (a power of two up to
// renewMax) of the lock table tbl (fam false) or of the families table
// (fam true), quoted, in dialect d: its arguments are the lease in
// microseconds, then the columns (renewCols, famRenewCols) of each lock.
func (r *renewTexts) text(d Dialect, tbl string, fam bool, n int) string {
	i, f := bits.Len(uint(n))-1, 0
	cols := renewCols
	now := nowMicros(d)
	if fam {
		f, cols = 1, famRenewCols
		if d == PostgreSQL {
			now = famNowPostgres // as the families' own statements
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.texts[f][i] != "" {
		return r.texts[f][i]
	}
	param := func(k int) string {
		switch d {
		case PostgreSQL:
			return fmt.Sprintf("$%d", k)
		case SQLite:
			return fmt.Sprintf("?%d", k)
		default:
			return "?" // MySQL: the arguments in order
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "UPDATE %s SET expires_us = %s + %s\nWHERE expires_us > %s AND (", tbl, now, param(1), now)
	for j := range n {
		if j > 0 {
			b.WriteString("\nOR ")
		}
		b.WriteString("(")
		for c, col := range cols {
			if c > 0 {
				b.WriteString(" AND ")
			}
			fmt.Fprintf(&b, "%s = %s", col, param(2+len(cols)*j+c))
		}
		b.WriteString(")")
	}
	b.WriteString(")")
	r.texts[f][i] = b.String()
	return r.texts[f][i]
}

// renewGroup is the batch group of a Handle's renewal: one per TTL, since a
// statement sets one lease, and per table (fam: the families table).
func renewGroup(ttl time.Duration, fam bool) uint64 {
	g := uint64(ttl.Microseconds()) << 1
	if fam {
		g |= 1
	}
	return g
}

// renewMany renews the leases of hs, locks of one TTL in one table
// (lease.Batcher's Send): a verdict per Handle, or an error for them all.
func (l *Locker) renewMany(ctx context.Context, hs []*Handle) ([]lease.Verdict, error) {
	res := make([]lease.Verdict, len(hs))
	if len(hs) > 1 {
		n := 1 << bits.Len(uint(len(hs)-1)) // the bucket: a power of two
		fam := hs[0].fam != 0
		suffix := ""
		if fam {
			suffix = famSuffix
		}
		text := l.renewTexts.text(l.dialect, l.table.quoted(l.dialect, suffix), fam, n)
		args := make([]any, 0, 1+len(famRenewCols)*n)
		args = append(args, hs[0].ttl.Microseconds())
		for j := range n {
			h := hs[min(j, len(hs)-1)] // padded with the last lock
			if fam {
				args = append(args, h.fam, h.key, h.seq, h.owner, h.token)
			} else {
				args = append(args, h.key, h.owner, h.token)
			}
		}
		cctx, cancel := l.callCtx(ctx)
		n64, err := l.rowsAffected(cctx, l.retryIdem, func(ctx context.Context) (sql.Result, error) {
			return l.db.ExecContext(ctx, text, args...)
		})
		cancel()
		if err != nil {
			return nil, err
		}
		if n64 == int64(len(hs)) {
			for i := range res {
				res[i].OK = true
			}
			return res, nil
		}
		// A lock of the batch is no longer ours: find which.
	}
	for i, h := range hs {
		ok, err := h.renewOne(ctx)
		if err != nil {
			return nil, err
		}
		res[i].OK = ok
	}
	return res, nil
}
