package benchmark_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/memlock"
	"github.com/go-locker/locker/sqltable"
	_ "github.com/go-locker/locker/sqltable/sqlite"
)

// heldOpeners are the Lockers of this module's backends that need no
// server: memlock, and the SQL table on SQLite.
func heldOpeners() map[string]func(tb testing.TB) locker.Locker {
	return map[string]func(tb testing.TB) locker.Locker{
		"memlock": func(tb testing.TB) locker.Locker {
			l := memlock.New()
			tb.Cleanup(func() { _ = l.Close() })
			return l
		},
		"sqlite": func(tb testing.TB) locker.Locker {
			l, err := sqltable.Open(context.Background(), "sqlite://"+filepath.Join(tb.TempDir(), "locks.db"))
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { _ = l.Close() })
			return l
		},
	}
}

// TestHeldGoroutines: a Locker holding 2,000 locks runs no more goroutines
// than one holding 128 (a goroutine per held lock would be 1,872 more).
func TestHeldGoroutines(t *testing.T) {
	for name, open := range heldOpeners() {
		t.Run(name, func(t *testing.T) {
			benchmark.CheckHeldGoroutines(t, benchmark.Held{Open: open})
		})
	}
}

// BenchmarkHeld is the Held case (10,000 locks held by one Locker) on
// memlock and SQLite:
//
//	go test -run '^$' -bench '^BenchmarkHeld$' -benchtime 1x ./conformance/benchmark
func BenchmarkHeld(b *testing.B) {
	for name, open := range heldOpeners() {
		b.Run(name, func(b *testing.B) { benchmark.RunHeld(b, benchmark.Held{Open: open}) })
	}
}
