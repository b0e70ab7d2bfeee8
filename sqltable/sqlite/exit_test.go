package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/go-locker/locker/internal/exiting"
	"github.com/go-locker/locker/sqltable"
	"github.com/go-locker/locker/sqltable/sqlite"
)

// exitHelper is set in the environment of the test binary run as a
// process that takes and releases a key, says it is exiting and closes
// its Locker, as the locker command does (see exitProcess).
const exitHelper = "LOCKER_SQLITE_EXIT_HELPER"

func TestMain(m *testing.M) {
	if p := os.Getenv(exitHelper); p != "" {
		os.Exit(exitProcess(p))
	}
	os.Exit(m.Run())
}

// exitProcess opens the database at p by URL, takes and releases "k"
// cycles times (printing each token), then closes its Locker after
// exiting.Begin and exits.
func exitProcess(p string) int {
	ctx := context.Background()
	l, err := sqltable.Open(ctx, "sqlite://"+p)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cycles, _ := strconv.Atoi(os.Getenv(exitHelper + "_CYCLES"))
	for range max(cycles, 1) {
		h, err := l.TryAcquire(ctx, "k")
		if err != nil {
			fmt.Fprintln(os.Stderr, "TryAcquire:", err)
			return 2
		}
		fmt.Println(h.Token())
		if err := h.Release(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "Release:", err)
			return 2
		}
	}
	exiting.Begin()
	if err := l.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "Close:", err)
		return 2
	}
	return 0
}

// rowToken reads the token in the lock table's row of "k" through a
// read-only connection.
func rowToken(t *testing.T, p string) int64 {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+p+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var tok int64
	if err := db.QueryRow(`SELECT token FROM locker_locks WHERE lock_key = 'k'`).Scan(&tok); err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestExitLeavesWAL: a process that closes its URL Locker while exiting
// (internal/exiting, as the locker command does) leaves the WAL's frames
// for the next process to recover instead of checkpointing them (the
// checkpoint and the WAL's restart cost the exit and the next process four
// disk syncs); the next process finds every earlier release (the key is
// free) and every earlier token (its own are above them); and the first
// process that exits with a WAL of at least exitWALMax (512 KiB)
// checkpoints it, so the WAL stays bounded.
func TestExitLeavesWAL(t *testing.T) {
	p := filepath.Join(t.TempDir(), "locks.db")
	wal := func() int64 {
		fi, err := os.Stat(p + "-wal")
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	var last int64
	shrunk := false
	for run := range 8 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), exitHelper+"="+p, exitHelper+"_CYCLES=10")
		out, err := cmd.Output()
		if err != nil {
			var stderr string
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("run %d: %v: %s", run, err, stderr)
		}
		for _, f := range strings.Fields(string(out)) {
			tok, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				t.Fatalf("run %d printed %q", run, out)
			}
			if tok <= last {
				t.Fatalf("run %d: token %d after %d: an earlier process's token was lost", run, tok, last)
			}
			last = tok
		}
		size := wal()
		switch {
		case size == 0:
			if run == 0 {
				t.Fatalf("the first exiting process left an empty WAL: it checkpointed at exit")
			}
			shrunk = true
		case size >= 1<<20:
			t.Fatalf("run %d left a WAL of %d bytes: exiting processes do not bound it", run, size)
		}
		// What the processes committed is in the database as read
		// from the WAL they left (read-only: no checkpoint at close).
		if got := rowToken(t, p); got != last {
			t.Fatalf("run %d: the key's row has token %d, want %d, the last one the process printed", run, got, last)
		}
		if after := wal(); after != size {
			t.Fatalf("run %d: the WAL went from %d to %d bytes when a read-only connection read it", run, size, after)
		}
		t.Logf("run %d: WAL %d bytes, last token %d", run, size, last)
	}
	if !shrunk {
		t.Errorf("no exiting process checkpointed a WAL over 512 KiB in 8 runs of 10 acquisitions")
	}
}

// BenchmarkExitRecovery is what an exiting process's WAL costs the next
// one: the open of the database and its first read, after processes that
// left a WAL of about 0, 256 KiB and 450 KiB (the largest they leave is
// exitWALMax), each on a fresh copy of the files. Set against the four
// disk syncs the exit spares (see keepWAL in url.go).
func BenchmarkExitRecovery(b *testing.B) {
	for _, c := range []struct {
		name   string
		cycles int // acquisitions in the process that leaves the WAL
	}{{"WAL=0", 0}, {"WAL=256KiB", 30}, {"WAL=450KiB", 52}} {
		b.Run(c.name, func(b *testing.B) {
			src := filepath.Join(b.TempDir(), "locks.db")
			cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
			cmd.Env = append(os.Environ(), exitHelper+"="+src, exitHelper+"_CYCLES="+strconv.Itoa(max(c.cycles, 1)))
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("%v: %s", err, out)
			}
			if c.cycles == 0 { // checkpoint what the process left
				db, err := sql.Open("sqlite", sqlite.DSN(src))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
					b.Fatal(err)
				}
				db.Close()
				if err := os.WriteFile(src+"-wal", nil, 0o600); err != nil { // as keepWAL leaves it
					b.Fatal(err)
				}
			}
			fi, err := os.Stat(src + "-wal")
			if err != nil {
				b.Fatal(err)
			}
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				dst := filepath.Join(b.TempDir(), "locks.db")
				for _, suf := range []string{"", "-wal", "-shm"} {
					data, err := os.ReadFile(src + suf)
					if os.IsNotExist(err) {
						continue
					}
					if err != nil {
						b.Fatal(err)
					}
					if err := os.WriteFile(dst+suf, data, 0o600); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				db, err := sql.Open("sqlite", sqlite.DSN(dst))
				if err != nil {
					b.Fatal(err)
				}
				var tok int64
				if err := db.QueryRow(`SELECT token FROM locker_locks WHERE lock_key = 'k'`).Scan(&tok); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				db.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(fi.Size())/1024, "KiB-WAL")
		})
	}
}
