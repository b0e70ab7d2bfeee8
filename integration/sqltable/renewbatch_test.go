package sqltable_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-locker/locker/integration/testserver"
)

// TestBatchedRenewalLosesOnlyItsLock: 20 locks of one Locker renew in
// batches; one of them has its row taken over from outside. Its holder
// learns of the loss at its next renewal (the batch renews fewer rows than
// it names, and each lock is asked on its own); the other 19 stay held
// through several more renewals.
func TestBatchedRenewalLosesOnlyItsLock(t *testing.T) {
	forEach(t, func(t *testing.T, d dialect) {
		l := open(t, d.url(t, "", nil))
		admin := d.admin(t)
		const ttl = 1500 * time.Millisecond
		hs := testserver.TakeKeys(t, l, "batch", 20, ttl)
		victim := hs[7]
		res, err := admin.ExecContext(context.Background(), fmt.Sprintf("UPDATE %s SET owner = 'intruder' WHERE lock_key = %s", d.table(""), d.ph(1)), victim.Key())
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			t.Fatalf("the takeover changed %d rows", n)
		}
		testserver.AwaitLost(t, victim, ttl)
		// Three more renewal rounds of the others.
		testserver.StayHeld(t, hs, victim, ttl, "another lock's row was taken over")
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
			hs := testserver.TakeKeys(t, l, "batchlocked", 10, ttl)
			victim := hs[4]
			tx, err := admin.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			var k string
			if err := tx.QueryRowContext(ctx, fmt.Sprintf("SELECT lock_key FROM %s WHERE lock_key = %s FOR UPDATE", d.table(""), d.ph(1)), victim.Key()).Scan(&k); err != nil {
				t.Fatal(err)
			}
			testserver.StayHeld(t, hs, victim, 2*ttl, "another lock's row was locked (a batch waited for the locked row)")
		})
	}
}
