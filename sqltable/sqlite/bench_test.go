package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/benchmark"
	"github.com/go-locker/locker/sqltable"
	"github.com/go-locker/locker/sqltable/sqlite"
)

// BenchmarkNewAndURL: a Locker from New on a *sql.DB opened with DSN and
// one from a sqlite: URL, interleaved on one file, uncontended: they have
// the same settings, so they should take the same time (issue 29: New on
// a plain sql.Open took 4.6 times the URL's, with synchronous=FULL, which
// New now refuses). The figure to read is new/url.
//
//	go test -run '^$' -bench NewAndURL -benchtime 3000x -count 3 ./sqltable/sqlite
func BenchmarkNewAndURL(b *testing.B) {
	file := filepath.Join(b.TempDir(), "locks.db")
	newSide := benchmark.LockerSide("new", 0, func(tb testing.TB) locker.Locker {
		db, err := sql.Open("sqlite", sqlite.DSN(file))
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { db.Close() })
		return sqltable.New(db)
	})
	urlSide := benchmark.LockerSide("url", 0, func(tb testing.TB) locker.Locker {
		l, err := sqltable.Open(context.Background(), "sqlite://"+file)
		if err != nil {
			tb.Fatal(err)
		}
		return l
	})
	benchmark.Run(b, benchmark.Harness{Sides: []benchmark.Side{newSide, urlSide}, Waiters: []int{}, Clients: 1})
}
