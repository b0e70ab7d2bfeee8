package sqltable_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
)

// TestRenewalsBatched: the renewals of 1,000 locks held by one Locker go
// out as a statement per batch, not a statement per lock. Counted by the
// server: PostgreSQL's committed transactions, MariaDB's UPDATE statements
// (SQLite has no server to count them; TestBatchedRenewalLosesOnlyItsLock
// runs its batches).
func TestRenewalsBatched(t *testing.T) {
	t.Run("PostgreSQL", func(t *testing.T) {
		h := heldPostgres(t, 1000)
		benchmark.CheckRenewalsBatched(t, h)
	})
	t.Run("MariaDB", func(t *testing.T) {
		d := dialects[2]
		admin := d.admin(t)
		updates := func() int64 {
			var name string
			var v int64
			if err := admin.QueryRowContext(context.Background(), "SHOW GLOBAL STATUS LIKE 'Com_update'").Scan(&name, &v); err != nil {
				t.Errorf("SHOW GLOBAL STATUS: %v", err)
			}
			return v
		}
		benchmark.CheckRenewalsBatched(t, benchmark.Held{N: 1000, Requests: updates, Open: func(tb testing.TB) locker.Locker {
			return open(tb, d.url(tb, "", nil))
		}})
	})
}

// TestRenewalsBatchedFamilies: the same for 500 semaphore permits and 500
// readers' locks on PostgreSQL: a batch renews the families table's rows.
func TestRenewalsBatchedFamilies(t *testing.T) {
	for name, take := range map[string]func(context.Context, locker.Locker, string, ...locker.Option) (locker.Handle, error){
		"Semaphore": benchmark.TakeSemaphorePermit,
		"Read":      benchmark.TakeRead,
	} {
		t.Run(name, func(t *testing.T) {
			h := heldPostgres(t, 500)
			h.Take = take
			benchmark.CheckRenewalsBatched(t, h)
		})
	}
}

// TestBatchedRenewalLosesOnlyItsLock: 20 locks of one Locker renew in
// batches; one of them has its row taken over from outside. Its holder
// learns of the loss at its next renewal (the batch renews fewer rows than
// it names, and each lock is asked on its own); the other 19 stay held
// through several more renewals.
func TestBatchedRenewalLosesOnlyItsLock(t *testing.T) {
	forEach(t, func(t *testing.T, d dialect) {
		l := open(t, d.url(t, "", nil))
		admin := d.admin(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		const ttl = 1500 * time.Millisecond
		base := fmt.Sprintf("batch/%d/", time.Now().UnixNano())
		var hs []locker.Handle
		for i := range 20 {
			h, err := l.TryAcquire(ctx, fmt.Sprintf("%s%d", base, i), locker.WithTTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			hs = append(hs, h)
		}
		defer func() {
			for _, h := range hs {
				_ = h.Release(ctx)
			}
		}()
		victim := hs[7]
		res, err := admin.ExecContext(ctx, fmt.Sprintf("UPDATE %s SET owner = 'intruder' WHERE lock_key = %s", d.table(""), d.ph(1)), victim.Key())
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			t.Fatalf("the takeover changed %d rows", n)
		}
		select {
		case <-victim.Done():
			if !errors.Is(victim.Err(), locker.ErrLost) {
				t.Fatalf("the taken-over lock ended with %v, want ErrLost", victim.Err())
			}
		case <-time.After(ttl):
			t.Fatalf("the taken-over lock was not reported lost within its TTL")
		}
		// Three more renewal rounds of the others.
		deadline := time.After(ttl)
		for {
			select {
			case <-deadline:
				for i, h := range hs {
					if h == victim {
						continue
					}
					if err := h.Err(); err != nil {
						t.Errorf("lock %d ended: %v", i, err)
					}
				}
				return
			case <-time.After(10 * time.Millisecond):
				for i, h := range hs {
					if h != victim && h.Err() != nil {
						t.Fatalf("lock %d ended: %v", i, h.Err())
					}
				}
			}
		}
	})
}

// TestBatchedRenewalPastALockedRow: another transaction keeps the row of
// one of 10 locks renewed in batches locked (SELECT ... FOR UPDATE, as a
// client gone silent inside a transaction would) for two TTLs. The other
// nine stay held: a batch waits for its rows no longer than its bound (a
// sixth of the TTL; on MySQL also the server's lock wait of a second),
// then renews each lock on its own.
func TestBatchedRenewalPastALockedRow(t *testing.T) {
	for _, d := range dialects[1:] { // SQLite locks the whole database, not a row
		t.Run(d.name, func(t *testing.T) {
			l := open(t, d.url(t, "", nil))
			admin := d.admin(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// On MySQL a batch waits up to a second on the server for the
			// locked row (innodb_lock_wait_timeout, its least), holding the
			// other rows it updated, before they renew on their own, and a
			// lock that joins a batch with the locked one again pays that
			// again: 6s leaves a third of the TTL, as 30s leaves a lot.
			ttl := 3 * time.Second
			if d.name == "MariaDB" {
				ttl = 6 * time.Second
			}
			base := fmt.Sprintf("batchlocked/%d/", time.Now().UnixNano())
			var hs []locker.Handle
			for i := range 10 {
				h, err := l.TryAcquire(ctx, fmt.Sprintf("%s%d", base, i), locker.WithTTL(ttl))
				if err != nil {
					t.Fatal(err)
				}
				hs = append(hs, h)
			}
			defer func() {
				for _, h := range hs {
					_ = h.Release(ctx)
				}
			}()
			victim := hs[4]
			tx, err := admin.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			var k string
			if err := tx.QueryRowContext(ctx, fmt.Sprintf("SELECT lock_key FROM %s WHERE lock_key = %s FOR UPDATE", d.table(""), d.ph(1)), victim.Key()).Scan(&k); err != nil {
				_ = tx.Rollback()
				t.Fatal(err)
			}
			ended := make(chan int, len(hs))
			for i, h := range hs {
				if h != victim {
					go func() { <-h.Done(); ended <- i }()
				}
			}
			select {
			case i := <-ended:
				_ = tx.Rollback()
				t.Fatalf("lock %d ended with %v while another lock's row was locked: %v", i, hs[i].Err(), "a batch waited for the locked row")
			case <-time.After(2 * ttl):
			}
			_ = tx.Rollback()
		})
	}
}
