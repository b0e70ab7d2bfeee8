package sqltable_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/sqltable"
)

// failoverTTL is the lease of the locks of TestStandbyPromotion: longer
// than a promotion takes on a loaded test machine (1–6s here), so that a
// holder whose row the new primary has renews it there in time.
const failoverTTL = 10 * time.Second

// TestStandbyPromotion: the SQL table on a PostgreSQL primary with a
// streaming standby, and on a MariaDB primary with a replica; the primary
// is killed while A holds a key and B waits for it, and the standby is
// promoted at once. On PostgreSQL both Lockers' pools name both servers
// (target_session_attrs=read-write), so their new connections go to the
// new primary; MariaDB's driver names one server, so they reach it through
// a proxy that the test points at the replica when it promotes it, as a
// virtual IP would be moved. The lock is a row, which the standby has once
// it has applied it:
//
//   - replicated: the standby had A's row. A's renewals, retried until its
//     lease's deadline, reach the new primary: A keeps the lock through the
//     failover, and B keeps waiting until A releases; B's token is greater.
//   - lagging, asynchronous standby: the standby is stalled behind more
//     WAL (binary log) than the sockets hold when A takes the key, so A's
//     row dies with the primary. The promoted standby has no holder: B
//     takes the key without waiting for A's lease, while A still holds it,
//     until A's next renewal finds its row gone (within a third of the
//     TTL). The seeds' failover argument, shown; the overlap goes to
//     CHAOS.md "Failover".
//   - lagging, synchronous standby (PostgreSQL's synchronous_standby_names,
//     MariaDB's semi-synchronous replication): A's acquisition cannot
//     commit while the standby is stalled; it fails (its context ends), so
//     A never holds what the standby lacks.
func TestStandbyPromotion(t *testing.T) {
	for _, c := range []struct {
		name string
		bed  func(t *testing.T, sync bool) failoverBed
	}{{"PostgreSQL", postgresBed}, {"MariaDB", mariaDBBed}} {
		t.Run(c.name, func(t *testing.T) {
			t.Run("replicated", func(t *testing.T) { standbyPromotion(t, c.bed(t, false), false) })
			t.Run("lagging/async", func(t *testing.T) { standbyPromotion(t, c.bed(t, false), true) })
			t.Run("lagging/sync", func(t *testing.T) { standbyPromotion(t, c.bed(t, true), true) })
		})
	}
}

// failoverBed is a primary and its standby, as standbyPromotion uses them.
type failoverBed struct {
	sync             bool
	newLocker        func(t *testing.T) *sqltable.Locker // a Locker of its own pool, through the failover
	primary, standby *testserver.Server
	backlog          func(t *testing.T, ctx context.Context) // more log than the sockets hold, on the primary
	caughtUp         func(t *testing.T, ctx context.Context) // waits until the standby has applied all
	promote          func(t *testing.T)                      // makes the standby the primary the Lockers reach
}

func postgresBed(t *testing.T, sync bool) failoverBed {
	pair := testserver.PostgresStandby(t, sync)
	dsn := pair.DSN(t)
	return failoverBed{
		sync: sync,
		newLocker: func(t *testing.T) *sqltable.Locker {
			l := sqltable.New(openDB(t, "pgx", dsn))
			t.Cleanup(func() { l.Close() })
			return l
		},
		primary: pair.Primary, standby: pair.Standby,
		backlog: func(t *testing.T, ctx context.Context) {
			backlog(t, ctx, openDB(t, "pgx", pair.Primary.DSN()), `INSERT INTO failover_backlog SELECT repeat(md5(i::text), 32) FROM generate_series(1, 48000) i`)
		},
		caughtUp: func(t *testing.T, ctx context.Context) { pair.WaitReplayed(t, ctx) },
		promote:  func(t *testing.T) { pair.Promote(t) },
	}
}

func mariaDBBed(t *testing.T, sync bool) failoverBed {
	pair := testserver.MariaDBReplica(t, sync)
	var pxs []*testserver.Proxy
	return failoverBed{
		sync: sync,
		newLocker: func(t *testing.T) *sqltable.Locker {
			px := testserver.NewProxy(t, pair.Primary.Addr())
			pxs = append(pxs, px)
			user, pass, dbName := mysqlCreds(t, pair.Primary.DSN())
			l := sqltable.New(openDB(t, "mysql", user+":"+pass+"@tcp("+px.Addr()+")/"+dbName))
			t.Cleanup(func() { l.Close() })
			return l
		},
		primary: pair.Primary, standby: pair.Replica,
		backlog: func(t *testing.T, ctx context.Context) {
			user, pass, dbName := mysqlCreds(t, pair.Primary.DSN())
			db := openDB(t, "mysql", user+":"+pass+"@tcp("+pair.Primary.Addr()+")/"+dbName)
			backlog(t, ctx, db, `INSERT INTO failover_backlog SELECT REPEAT(MD5(seq), 32) FROM seq_1_to_48000`)
		},
		caughtUp: func(t *testing.T, ctx context.Context) { pair.WaitReplicated(t, ctx) },
		promote: func(t *testing.T) {
			pair.Promote(t)
			for _, px := range pxs {
				px.Retarget(t, pair.Replica.Addr())
			}
		},
	}
}

func standbyPromotion(t *testing.T, bed failoverBed, lag bool) {
	sync := bed.sync
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, b := bed.newLocker(t), bed.newLocker(t)
	k := testKey(t, "")
	// Both Lockers make the table and their statements now, while both
	// servers are up.
	mustRelease(t, ctx, mustAcquire(t, ctx, a, k+"/warm"))
	mustRelease(t, ctx, mustAcquire(t, ctx, b, k+"/warm"))
	bed.caughtUp(t, ctx)
	if lag {
		bed.standby.Pause(t)
		if !sync {
			// More log than the sockets hold, ahead of A's row: the
			// row waits in the primary, and dies with it.
			bed.backlog(t, ctx)
		}
	}
	actx, acancel := context.WithTimeout(ctx, 3*time.Second)
	ha, errA := a.Acquire(actx, k, locker.WithTTL(failoverTTL))
	acancel()
	aAt := time.Now()
	if sync && lag {
		if errA == nil {
			t.Fatalf("A's Acquire returned a lock while the synchronous standby was stalled (token %d)", ha.Token())
		}
		t.Logf("A's Acquire while the synchronous standby was stalled: %v", errA)
	} else if errA != nil {
		t.Fatalf("A's Acquire: %v", errA)
	}
	if !lag {
		bed.caughtUp(t, ctx)
	}
	type res struct {
		h   locker.Handle
		err error
		at  time.Time
	}
	// An Acquire that cannot reach the database returns its error
	// (doc.go, "Failure modes"): B tries again, as a caller must, until it
	// holds the key.
	got := make(chan res, 1)
	go func() {
		for {
			h, err := b.Acquire(ctx, k, locker.WithTTL(failoverTTL))
			if err == nil || ctx.Err() != nil {
				got <- res{h, err, time.Now()}
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	killed := time.Now()
	bed.primary.Kill(t)
	if lag {
		bed.standby.Resume(t)
	}
	bed.promote(t)
	promoted := time.Now()
	t.Logf("promoted %v after the kill", promoted.Sub(killed).Round(time.Millisecond))
	if !lag {
		// A keeps its lock: past its lease's length after the kill it
		// still holds (a renewal reached the new primary), and B waits.
		select {
		case <-ha.Done():
			t.Fatalf("A lost its lock across the failover though the standby had its row: %v", ha.Err())
		case rb := <-got:
			t.Fatalf("B got the key across the failover while A held it (B: %v)", rb.err)
		case <-time.After(time.Until(killed.Add(failoverTTL + 2*time.Second))):
		}
		released := time.Now()
		mustRelease(t, ctx, ha)
		select {
		case rb := <-got:
			if rb.err != nil {
				t.Fatalf("B's Acquire after A's release: %v", rb.err)
			}
			defer rb.h.Release(ctx)
			t.Logf("A kept its lock through the failover; B held %v after A's release; tokens A %d, B %d",
				rb.at.Sub(released).Round(time.Millisecond), ha.Token(), rb.h.Token())
			if rb.h.Token() <= ha.Token() {
				t.Errorf("B's token %d is not greater than A's %d across the promotion", rb.h.Token(), ha.Token())
			}
		case <-time.After(30 * time.Second):
			t.Fatal("B did not get the key within 30s of A's release on the new primary")
		}
		return
	}
	var rb res
	select {
	case rb = <-got:
	case <-time.After(60 * time.Second):
		t.Fatal("B did not get the key within 60s of the promotion")
	}
	if rb.err != nil {
		t.Fatalf("B's Acquire across the failover: %v", rb.err)
	}
	defer rb.h.Release(ctx)
	if ha == nil {
		t.Logf("B held %v after the promotion, token %d; A never held", rb.at.Sub(promoted).Round(time.Millisecond), rb.h.Token())
		return
	}
	// The documented weakness of an asynchronous standby: A's row was
	// lost, and B did not wait for A's lease.
	if !rb.at.Before(aAt.Add(failoverTTL)) {
		t.Errorf("B held %v after A's acquisition, not before A's lease (%v) could end: the stalled standby had A's row after all (the test's lag did not hold)", rb.at.Sub(aAt), failoverTTL)
	}
	var lostAt time.Time
	select {
	case <-ha.Done():
		lostAt = time.Now()
	case <-time.After(failoverTTL):
		t.Fatalf("A was not told of its loss within its lease (%v) of B's acquisition", failoverTTL)
	}
	if !errors.Is(ha.Err(), locker.ErrLost) {
		t.Errorf("A's Err after its row was lost = %v, want ErrLost", ha.Err())
	}
	overlap := time.Duration(0)
	if lostAt.After(rb.at) {
		overlap = lostAt.Sub(rb.at)
	}
	t.Logf("A's row lost with the primary: B held %v after the promotion; A told of its loss %v after the kill; two holders for %v; tokens A %d, B %d",
		rb.at.Sub(promoted).Round(time.Millisecond), lostAt.Sub(killed).Round(time.Millisecond), overlap.Round(time.Millisecond), ha.Token(), rb.h.Token())
}

// backlog writes about 50MB of log on the primary (a table of its own),
// more than the sockets between a stalled standby and its primary hold.
func backlog(t *testing.T, ctx context.Context, db *sql.DB, insert string) {
	t.Helper()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS failover_backlog (v text)`); err != nil {
		t.Fatalf("backlog: %v", err)
	}
	if _, err := db.ExecContext(ctx, insert); err != nil {
		t.Fatalf("backlog: %v", err)
	}
}
