package sqltable_test

import (
	"context"
	"database/sql"
	"net/url"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/sqltable"
)

// suiteTTL is the lease the suite asks for; renewals run every TTL/3.
const suiteTTL = 2 * time.Second

// steal expires key's row from another connection, as an operator taking a
// lock away would: the next acquirer takes the key at once, and the robbed
// holder's next renewal finds its lease over.
func steal(t *testing.T, d dialect, admin *sql.DB, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := admin.ExecContext(ctx, "UPDATE "+d.table("")+" SET expires_us = 0 WHERE lock_key = "+d.ph(1), key)
	if err != nil {
		t.Fatalf("Steal: %v", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("Steal: %d rows updated, want 1", n)
	}
}

func TestConformance(t *testing.T) {
	t.Run("SQLite", func(t *testing.T) {
		d := dialects[0]
		file := sqliteFile(t)
		admin := d.admin(t)
		var faults testserver.Registry[*faultDB]
		conformance.Run(t, conformance.Harness{
			IgnoreGoroutines: testserver.ProxyGoroutines,
			NewLocker: func(t *testing.T) locker.Locker {
				// Another process, as far as the lock table can tell: a
				// pool of its own on the same file.
				db, f := openFaultDB(t, file+"?_pragma=busy_timeout(50)")
				db.SetMaxOpenConns(4)
				l := sqltable.New(db, sqltable.WithDialect(sqltable.SQLite))
				faults.Put(l, f)
				t.Cleanup(func() { l.Close() })
				return l
			},
			// Crash: every later statement of the client fails at once; its
			// rows stay until their lease runs out.
			Crash: func(t *testing.T, l locker.Locker) { faults.Get(t, l, "Crash").Crash() },
			// Cut: every statement of the client hangs until heal.
			Cut:       func(t *testing.T, l locker.Locker) func() { return faults.Get(t, l, "Cut").Cut() },
			Steal:     func(t *testing.T, h locker.Handle) { steal(t, d, admin, h.Key()) },
			LossBound: suiteTTL/3 + time.Second,
			URL:       sqliteURL(t),
			TTL:       suiteTTL,
			MinTTL:    sqltable.MinTTL,
			// Waiters in other processes are woken through the signal
			// file; a lost signal costs at most the retry interval (1s
			// by default).
			HandoffBound: 1500 * time.Millisecond,
			ManyKeys:     500,
		})
	})
	for _, d := range dialects[1:] {
		t.Run(d.name, func(t *testing.T) {
			addr := d.addr(t)
			admin := d.admin(t)
			var proxies testserver.Registry[*testserver.Proxy]
			conformance.Run(t, conformance.Harness{
				IgnoreGoroutines: testserver.ProxyGoroutines,
				NewLocker: func(t *testing.T) locker.Locker {
					px := testserver.NewProxy(t, addr)
					l := open(t, d.url(t, px.Addr(), url.Values{"lock_max_conns": {"20"}}))
					proxies.Put(l, px)
					return l
				},
				// Crash closes every connection of the client and refuses
				// new ones: its rows stay until their lease runs out.
				Crash: func(t *testing.T, l locker.Locker) { proxies.Get(t, l, "Crash").Crash(t) },
				Cut: func(t *testing.T, l locker.Locker) func() {
					px := proxies.Get(t, l, "Cut")
					px.Partition(t)
					return func() { px.Heal(t) }
				},
				Steal:        func(t *testing.T, h locker.Handle) { steal(t, d, admin, h.Key()) },
				LossBound:    suiteTTL/3 + time.Second,
				URL:          d.url(t, "", nil),
				TTL:          suiteTTL,
				MinTTL:       sqltable.MinTTL,
				HandoffBound: time.Second,
				ManyKeys:     500,
			})
		})
	}
}
