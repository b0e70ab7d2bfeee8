package sqltable

import (
	"context"
	"database/sql"
	"fmt"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
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

// The batches were off for a while (6 Dec 2026): under CPU load (two
// busy loops beside the -race test on 2 cores) 1 to 3 of 1,000 locks held
// with a TTL of 3s were lost on PostgreSQL. The
// cause was not the batches (one by one, renewals lost locks under the
// same load too): the takers' transactions held every connection of the
// pool, and the renewals waited for one (up to 0.4s) before their
// statements (slow too under that load) ran; the acquisitions' share of
// the pool (pool.go) now keeps a connection for them.

// renewMax is the most renewals one statement carries (the last bucket).
const renewMax = 128

// renewBuckets is how many statement texts renewMany uses: 1, 2, 4, ... renewMax.
const renewBuckets = 8

// renewTexts builds and keeps the batched renewal's statement texts: of
// the lock table, and of the families table.
type renewTexts struct {
	mu    sync.Mutex
	texts [2][renewBuckets]string

	// Whether a MySQL-dialect server is MariaDB, once read (serverMariaDB).
	flavor atomic.Int32
}

// The server's flavour, as renewTexts.flavor records it.
const (
	flavorUnknown = iota
	flavorMySQL
	flavorMariaDB
)

// serverMariaDB reports whether the server is MariaDB (whose batch bounds
// its lock wait with SET STATEMENT; MySQL's with a SET_VAR hint, which
// MariaDB would read as a comment). init reads it when the bell is on;
// otherwise the first batch of a MySQL-dialect Locker reads it, once.
func (l *Locker) serverMariaDB(ctx context.Context) (bool, error) {
	if l.dialect != MySQL {
		return false, nil
	}
	if l.bell != nil {
		return l.mariaDB, nil
	}
	r := &l.renewTexts
	if f := r.flavor.Load(); f != flavorUnknown {
		return f == flavorMariaDB, nil
	}
	// Unknown: read it. Batches that come meanwhile read it too (no lock
	// held across the round trip); each stores the same answer.
	cctx, cancel := l.callCtx(ctx)
	defer cancel()
	var v string
	if err := l.retryIdem(cctx, func(ctx context.Context) error {
		return l.db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v)
	}); err != nil {
		return false, fmt.Errorf("sqltable: read the server's version: %w", err)
	}
	f := int32(flavorMySQL)
	if strings.Contains(v, "MariaDB") {
		f = flavorMariaDB
	}
	r.flavor.Store(f)
	return f == flavorMariaDB, nil
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
func (r *renewTexts) text(d Dialect, tbl string, fam, mariaDB bool, n int) string {
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
	switch {
	case d == MySQL && mariaDB:
		b.WriteString("SET STATEMENT innodb_lock_wait_timeout=1 FOR ")
		b.WriteString("UPDATE ")
	case d == MySQL:
		b.WriteString("UPDATE /*+ SET_VAR(innodb_lock_wait_timeout=1) */ ")
	default:
		b.WriteString("UPDATE ")
	}
	fmt.Fprintf(&b, "%s SET expires_us = %s + %s\nWHERE ", tbl, now, param(1))
	if d == PostgreSQL {
		// Rows another transaction has locked are skipped, not waited
		// for: the batch renews fewer rows than it names, and each lock
		// then renews on its own.
		pk, sel := "lock_key", "lock_key"
		if fam {
			pk, sel = "(family, lock_key, seq)", "family, lock_key, seq"
		}
		fmt.Fprintf(&b, "%s IN (SELECT %s FROM %s WHERE ", pk, sel, tbl)
	}
	fmt.Fprintf(&b, "expires_us > %s AND (", now)
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
	if d == PostgreSQL {
		b.WriteString(" FOR UPDATE SKIP LOCKED)")
	}
	if returnsOwners(d) {
		b.WriteString("\nRETURNING owner")
	}
	r.texts[f][i] = b.String()
	return r.texts[f][i]
}

// returnsOwners reports whether d's batch names the rows it renewed
// (RETURNING: PostgreSQL, SQLite), by owner, which is unique per
// acquisition: then only the locks it did not renew are asked on their
// own. MySQL's UPDATE has no RETURNING: there every lock of a batch that
// renewed fewer rows than it names is.
func returnsOwners(d Dialect) bool { return d == PostgreSQL || d == SQLite }

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
// (lease.Batcher's Send), reporting each lock's verdict, or returns an
// error for them all.
//
// A row that another transaction keeps locked (a client gone silent inside
// a transaction that touched it: on MySQL a families head transaction
// locks the live holders' rows it scanned, until wait_timeout) must hold up
// that lock's renewal only, not the batch's. On PostgreSQL the batch skips
// locked rows (FOR UPDATE SKIP LOCKED); on MySQL and MariaDB it waits for a
// row lock at most a second (innodb_lock_wait_timeout, its least, for that
// statement), and is not tried again; SQLite locks the whole database, as
// every statement does. When the batch renewed fewer rows than it names
// (a lock no longer ours, a row skipped) or waited past that second, each
// lock is renewed on its own, all at once, and its verdict reported as it
// comes: the lock whose row is locked waits, as a renewal of it alone would
// have, and the others return.
func (l *Locker) renewMany(ctx context.Context, hs []*Handle, report func(int, lease.Verdict)) error {
	var ask []int // the locks to ask on their own, by index in hs; nil: every one
	if len(hs) > 1 {
		renewed, all, err := l.renewBatch(ctx, hs)
		switch {
		case err != nil:
			return err
		case all:
			for i := range hs {
				report(i, lease.Verdict{OK: true})
			}
			return nil
		}
		// A lock of the batch is no longer ours, or its row is locked:
		// ask each lock on its own that the batch did not renew (every
		// one where the batch does not say which it did).
		if renewed != nil {
			ask = make([]int, 0, len(hs))
			for i, h := range hs {
				if _, ok := renewed[h.owner]; ok {
					report(i, lease.Verdict{OK: true})
				} else {
					ask = append(ask, i)
				}
			}
		}
	}
	if ask == nil {
		if len(hs) == 1 {
			ok, err := hs[0].renewOne(ctx)
			report(0, lease.Verdict{OK: ok, Err: err})
			return nil
		}
		ask = make([]int, len(hs))
		for i := range ask {
			ask[i] = i
		}
	}
	var wg sync.WaitGroup
	for _, i := range ask {
		wg.Go(func() {
			ok, err := hs[i].renewOne(ctx)
			report(i, lease.Verdict{OK: ok, Err: err})
		})
	}
	wg.Wait()
	return nil
}

// renewBatch runs hs's batched statement: all reports whether it renewed
// every lock, renewed (on PostgreSQL and SQLite, when not all) the owners
// of the rows it did renew. Neither all nor an error means the locks it
// did not renew must be asked on their own (a lock no longer ours, a row
// locked, or the server's flavour unknown for now: then renewed is nil).
func (l *Locker) renewBatch(ctx context.Context, hs []*Handle) (renewed map[string]struct{}, all bool, err error) {
	n := 1 << bits.Len(uint(len(hs)-1)) // the bucket: a power of two
	fam := hs[0].fam != 0
	suffix := ""
	if fam {
		suffix = famSuffix
	}
	mariaDB, ferr := l.serverMariaDB(ctx)
	if ferr != nil {
		return nil, false, nil // each lock on its own, which needs no flavour
	}
	text := l.renewTexts.text(l.dialect, l.table.quoted(l.dialect, suffix), fam, mariaDB, n)
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
	defer cancel()
	if returnsOwners(l.dialect) {
		err := l.retryIdem(cctx, func(ctx context.Context) error {
			renewed = make(map[string]struct{}, len(hs))
			rows, err := l.db.QueryContext(ctx, text, args...)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var owner string
				if err := rows.Scan(&owner); err != nil {
					return err
				}
				renewed[owner] = struct{}{}
			}
			return rows.Err()
		})
		if err != nil {
			return nil, false, err
		}
		return renewed, len(renewed) == len(hs), nil
	}
	// MySQL: a lock wait that timed out is transient, and retry would
	// wait again: once, then each lock on its own.
	once := func(ctx context.Context, f func(context.Context) error) error { return f(ctx) }
	n64, err := l.rowsAffected(cctx, once, func(ctx context.Context) (sql.Result, error) {
		return l.db.ExecContext(ctx, text, args...)
	})
	switch {
	case err == nil:
		return nil, n64 == int64(len(hs)), nil
	case cctx.Err() == nil && l.transient(err):
		return nil, false, nil // waited for a locked row past its second
	}
	return nil, false, err
}
