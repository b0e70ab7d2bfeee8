package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/sqltable"
)

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "afile")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	const secret = "s3cr3t-pw"
	for _, c := range []struct {
		url     string
		invalid bool   // wraps ErrInvalidURL
		want    string // in the message
	}{
		{"sqlite://" + dir + "/x.db?bogus=1", true, `unknown parameter(s) bogus`},
		{"sqlite://" + dir + "/x.db?ttl=1ms", true, `outside the portable range`},
		{"sqlite://" + dir + "/x.db?lock_table=1bad", true, `table name "1bad"`},
		{"sqlite://" + dir + "/x.db?lock_table=a.b.c", true, `at most one '.'`},
		{"sqlite://" + dir + "/x.db?lock_table=" + strings.Repeat("a", 59), true, `1 to 58`},
		{"sqlite://" + dir + "/x.db?lock_table=", true, `parameter "lock_table" is empty`},
		{"sqlite://" + dir + "/x.db?lock_file_mode=0400", true, `octal file mode`},
		{"sqlite://" + dir + "/x.db?lock_file_mode=rw", true, `octal file mode`},
		{"sqlite://" + dir + "/x.db?ttl=5", true, `not a duration`},
		{"sqlite://host/x.db", true, `has a host "host"`},
		{"sqlite:", true, `names no database file`},
		{"sqlite::memory:", true, `in-memory`},
		{"sqlite://" + dir + "/", true, `names a directory`},
		{"sqlite://" + dir + "/missing/x.db", false, `directory "` + dir + `/missing" of the database file does not exist`},
		{"sqlite://" + file + "/x.db", false, `is not a directory`},
		{"sqlite://" + dir + "/x.db?lock_notify=maybe", true, `not true or false`},
	} {
		l, err := locker.Open(context.Background(), c.url)
		if err == nil {
			l.Close()
			t.Errorf("Open(%q) succeeded", c.url)
			continue
		}
		if c.invalid != errors.Is(err, locker.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v; wraps ErrInvalidURL: %v, want %v", c.url, err, !c.invalid, c.invalid)
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open(%q) = %v, want it to say %q", c.url, err, c.want)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%q) echoes the password: %v", c.url, err)
		}
	}
}

func TestSQLiteFileMode(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		query string
		want  os.FileMode
	}{
		{"", 0o600},
		{"?lock_file_mode=0640", 0o640},
	} {
		p := filepath.Join(t.TempDir(), "locks.db")
		l, err := sqltable.Open(ctx, "sqlite://"+p+c.query)
		if err != nil {
			t.Fatal(err)
		}
		h, err := l.TryAcquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{p, p + "-wal", p + "-shm"} {
			fi, err := os.Stat(f)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if fi.Mode().Perm() != c.want {
				t.Errorf("%s has mode %v, want %v", filepath.Base(f), fi.Mode().Perm(), c.want)
			}
		}
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWALKept: a URL's Locker leaves the -wal file in place, empty, when
// it closes, and the lock table intact, so that the next process to open
// the database (a locker run per command) neither creates it again nor
// recovers old frames; a second Locker then reads what the first wrote.
func TestWALKept(t *testing.T) {
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "locks.db")
	var tokens []int64
	for range 2 {
		l, err := sqltable.Open(ctx, "sqlite://"+p)
		if err != nil {
			t.Fatal(err)
		}
		h, err := l.TryAcquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, h.Token())
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{p + "-wal", p + "-shm"} {
			if _, err := os.Stat(f); err != nil {
				t.Errorf("after Close: %v", err)
			}
		}
		if fi, err := os.Stat(p + "-wal"); err == nil && fi.Size() != 0 {
			t.Errorf("after Close the -wal file has %d bytes, want 0 (checkpointed and emptied)", fi.Size())
		}
	}
	if tokens[1] <= tokens[0] {
		t.Errorf("tokens %v: the second Locker's is not above the first's", tokens)
	}
}

func TestSQLiteRelativePath(t *testing.T) {
	t.Chdir(t.TempDir())
	ctx := context.Background()
	l, err := locker.Open(ctx, "sqlite:locks.db")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("locks.db"); err != nil {
		t.Errorf("sqlite:locks.db did not make ./locks.db: %v", err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestTemporarySchemaRefused: a table in a temporary schema, where each
// connection has tables of its own, is refused by Open and New with an
// error naming the option; PostgreSQL's are ordinary schemas here.
func TestTemporarySchemaRefused(t *testing.T) {
	dir := t.TempDir()
	for _, u := range []string{
		"sqlite://" + dir + "/x.db?lock_table=temp.locks",
		"sqlite://" + dir + "/x.db?lock_table=Temp.locks",
	} {
		l, err := locker.Open(context.Background(), u)
		if err == nil {
			l.Close()
			t.Errorf("Open(%q) succeeded", u)
			continue
		}
		if !errors.Is(err, locker.ErrInvalidURL) || !errors.Is(err, locker.ErrInvalidOption) || !errors.Is(err, locker.ErrUnsafeConfig) || !strings.Contains(err.Error(), "lock_table") {
			t.Errorf("Open(%q) = %v; want ErrInvalidURL, ErrInvalidOption and an unsafe configuration naming lock_table", u, err)
		}
	}
	for _, u := range []string{
		"sqlite://" + dir + "/x.db?lock_table=pg_temp.locks",
	} {
		l, err := locker.Open(context.Background(), u)
		if err != nil {
			t.Errorf("Open(%q) = %v, want an ordinary schema", u, err)
			continue
		}
		l.Close()
	}
	db, _ := sqliteDB(t)
	l := sqltable.New(db, sqltable.WithTable("temp.locks"))
	defer l.Close()
	if err := l.Err(); !errors.Is(err, locker.ErrInvalidOption) || !errors.Is(err, locker.ErrUnsafeConfig) || !strings.Contains(err.Error(), "WithTable") {
		t.Errorf("New(WithTable(temp.locks)).Err() = %v; want ErrInvalidOption, an unsafe configuration naming WithTable", err)
	}
	if _, err := l.TryAcquire(context.Background(), "k"); !errors.Is(err, locker.ErrInvalidOption) {
		t.Errorf("TryAcquire = %v, want the option's error", err)
	}
	// An in-memory database, given as a *sql.DB: refused at the first call.
	mem, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	lm := sqltable.New(mem)
	defer lm.Close()
	if _, err := lm.TryAcquire(context.Background(), "k"); !errors.Is(err, locker.ErrUnsafeConfig) {
		t.Errorf("TryAcquire on an in-memory database = %v, want an unsafe configuration", err)
	}
}
