package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/sqltable"
	"github.com/go-locker/locker/sqltable/sqlite"
)

// TestNewChecksSQLiteSettings: a Locker on a *sql.DB whose connections
// would make every lock operation wait for the disk (synchronous=FULL, the
// driver's default, or EXTRA) or risk the file (OFF) is refused at its
// first call, with an error naming the setting and the DSN that sets it
// right; the DSN's setting works, and a file not in WAL mode is put in it.
func TestNewChecksSQLiteSettings(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name, query string
		want        error // nil: works
		says        string
	}{
		{"Plain", "", locker.ErrInvalidOption, "synchronous=FULL"},
		{"Full", "?_pragma=synchronous(FULL)", locker.ErrInvalidOption, "synchronous=FULL"},
		{"Extra", "?_pragma=synchronous(EXTRA)", locker.ErrInvalidOption, "synchronous=EXTRA"},
		{"Off", "?_pragma=synchronous(OFF)", locker.ErrUnsafeConfig, "synchronous=OFF"},
		{"NormalOnly", "?_pragma=synchronous(NORMAL)", nil, ""},
		{"DSN", sqlite.DSN(""), nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "locks.db")
			db, err := sql.Open("sqlite", p+c.query)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			l := sqltable.New(db)
			defer l.Close()
			h, err := l.TryAcquire(ctx, "k")
			if c.want == nil {
				if err != nil {
					t.Fatalf("TryAcquire on %q: %v", c.query, err)
				}
				_ = h.Release(ctx)
				var mode string
				if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
					t.Errorf("journal_mode after the first call = %q, %v; want wal", mode, err)
				}
				return
			}
			if err == nil {
				_ = h.Release(ctx)
				t.Fatalf("TryAcquire on a *sql.DB with DSN %q succeeded; want it refused (%s)", "locks.db"+c.query, c.says)
			}
			if !errors.Is(err, c.want) {
				t.Errorf("TryAcquire = %v; want it to wrap %v", err, c.want)
			}
			for _, s := range []string{c.says, sqlite.DSN(p)} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("TryAcquire = %v; want it to say %q", err, s)
				}
			}
		})
	}
}
