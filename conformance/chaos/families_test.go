package chaos

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/memlock"
	"github.com/go-locker/locker/sqltable"
)

// The family runs: a semaphore and reader-writer locks on memlock (in
// process, with permits and locks revoked in the store) and on the SQLite
// lock table (worker processes, holders stopped past their lease), and
// broken families that the checks must catch.

// semLimit is the semaphore runs' n.
const semLimit = 2

// memlockFamilyHarness runs in-process workers on one memlock Store, in
// family fam, each worker's Locker made by wrap; its fault revokes the
// target's lock (its permit, read or write lock) in the store.
func memlockFamilyHarness(fam Family, d time.Duration, wrap func(*memlock.Locker) locker.Locker) Harness {
	store := memlock.NewStore()
	return Harness{
		Family:    fam,
		InProcess: true,
		TTL:       locker.MinTTL,
		Duration:  d,
		Workers:   6, // three per key: the limit binds often
		NewLocker: func(t *testing.T, w Worker) locker.Locker { return wrap(store.NewLocker()) },
		Faults: []Fault{{Name: "revoke", Inject: func(t *testing.T, tg Target) func() {
			if tg.Key != "" {
				store.RevokeToken(tg.Key, tg.Token)
			}
			return nil
		}}},
	}
}

func asIs(l *memlock.Locker) locker.Locker { return l }

// maxTogether is the most holds of one key in use at once (by the
// recorded times) among those that pass keep.
func maxTogether(r *Report, keep func(Hold) bool) int {
	best := 0
	for i, a := range r.Holds {
		if !keep(a) {
			continue
		}
		n := 1
		for _, b := range r.Holds[:i] { // acquired before a
			if b.Key == a.Key && keep(b) && (b.Released.IsZero() || b.Released.After(a.Acquired)) {
				n++
			}
		}
		best = max(best, n)
	}
	return best
}

func all(Hold) bool { return true }

// TestChaosMemlockSemaphore: memlock's semaphore keeps its limit, its
// tokens and its fencing while permits are revoked.
func TestChaosMemlockSemaphore(t *testing.T) {
	r := Run(t, memlockFamilyHarness(Semaphore(semLimit), testDuration, asIs))
	if r.Faults["revoke"] == 0 || r.LossReported == 0 || r.Writes == 0 {
		t.Errorf("the run exercised too little: %v", r)
	}
	if n := maxTogether(r, all); n < semLimit {
		t.Errorf("never %d permits of a key in use at once (at most %d): the limit was not exercised", semLimit, n)
	}
}

// TestChaosMemlockReadWrite: memlock's reader-writer locks keep readers
// apart from writers, their tokens and their fencing while locks are
// revoked.
func TestChaosMemlockReadWrite(t *testing.T) {
	r := Run(t, memlockFamilyHarness(ReadWrite(), testDuration, asIs))
	if r.Faults["revoke"] == 0 || r.LossReported == 0 || r.Writes == 0 || r.Reads == 0 {
		t.Errorf("the run exercised too little: %v", r)
	}
	if n := maxTogether(r, func(h Hold) bool { return h.Mode == modeRead }); n < 2 {
		t.Errorf("never two readers of a key at once: sharing was not exercised")
	}
}

// overAdmits is a broken semaphore: it lets n+1 hold a semaphore of n.
type overAdmits struct{ *memlock.Locker }

func (l overAdmits) AcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	return l.Locker.AcquireSemaphore(ctx, key, n+1, opts...)
}

func (l overAdmits) TryAcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	return l.Locker.TryAcquireSemaphore(ctx, key, n+1, opts...)
}

// writeIsRead is a broken reader-writer lock: its write lock is a read
// lock, so a writer is admitted beside readers and other writers.
type writeIsRead struct{ *memlock.Locker }

func (l writeIsRead) AcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return l.Locker.AcquireRead(ctx, key, opts...)
}

func (l writeIsRead) TryAcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return l.Locker.TryAcquireRead(ctx, key, opts...)
}

// TestCatchesFamilyFlaws: the family runs fail a semaphore that admits
// n+1 and a write lock that is a read lock.
func TestCatchesFamilyFlaws(t *testing.T) {
	t.Parallel()               // with TestFamilyWorkerProcesses: neither times anything closely
	const d = 12 * time.Second // see the semaphore's case below
	for _, c := range []struct {
		name string
		h    Harness
		want []string
	}{
		{"SemaphoreAdmitsNPlus1", memlockFamilyHarness(Semaphore(1), d, func(l *memlock.Locker) locker.Locker { return overAdmits{l} }),
			[]string{"more holders than a semaphore of 1 admits", "none of which had lost its permit"}},
		{"WriteLockIsReadLock", memlockFamilyHarness(ReadWrite(), d, func(l *memlock.Locker) locker.Locker { return writeIsRead{l} }),
			[]string{"a writer beside other holders"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.h.Settle = 2 * time.Second // faults in the first 4s too
			// The register sees the semaphore's flaw only when n+1
			// holders are each between their first write and their leave,
			// and a revoke can explain one such sighting. On two keys with
			// a semaphore of 2 in 6s it saw it 0 to 6 times a run, and a
			// run with none, or whose only one a revoke explained, missed
			// the flaw (CI of 92ae42f, seed 14125642429623671673; 1 of 12
			// runs here). So: a semaphore of 1 (two admitted) on one key
			// that all six workers queue on, for 12s.
			c.h.Keys = 1
			r := exercise(t, c.h)
			for _, w := range c.want {
				if !hasViolation(r, w) {
					t.Errorf("no violation %q: %v\n%s", w, r, strings.Join(r.Violations, "\n"))
				}
			}
			t.Logf("caught: %v (%d violations; the first: %s)", r, len(r.Violations), first(r.Violations))
		})
	}
}

func first(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return s[0]
}

// sqliteFamilyRun runs family fam on the SQLite lock table across
// processes, with holders stopped past their lease; it skips, saying so,
// while sqltable's Locker lacks the family.
func sqliteFamilyRun(t *testing.T, fam Family) {
	h := sqliteHarness(t, func(l locker.Locker) locker.Locker { return l })
	h.Family, h.Duration = fam, testDuration
	skipWithoutFamily(t, fam)
	r := Run(t, h)
	if r == nil {
		return // a worker process
	}
	if r.Faults["holder-pause"] == 0 || r.Acquired == 0 {
		t.Errorf("the run exercised too little: %v", r)
	}
}

// TestChaosSQLiteSemaphore: the SQLite lock table's semaphore across
// processes.
func TestChaosSQLiteSemaphore(t *testing.T) { sqliteFamilyRun(t, Semaphore(semLimit)) }

// TestChaosSQLiteReadWrite: the SQLite lock table's reader-writer locks
// across processes.
func TestChaosSQLiteReadWrite(t *testing.T) { sqliteFamilyRun(t, ReadWrite()) }

// TestFamilyWorkerProcesses: a family run's worker processes get the
// family and take its locks (each process has a memlock Store of its own,
// so one worker only: there is nobody to contend with, but the plumbing
// between the processes is the SQLite runs', with holders paused).
func TestFamilyWorkerProcesses(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		fam   Family
		modes []string
	}{
		{"Semaphore", Semaphore(semLimit), []string{modePermit}},
		{"ReadWrite", ReadWrite(), []string{modeRead, modeWrite}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := Run(t, Harness{
				Family:    c.fam,
				Workers:   1,
				Keys:      1, // a worker alone takes each key again in the settle only if it has one
				TTL:       locker.MinTTL,
				Duration:  8 * time.Second, // the last 4 (Settle: 4 TTL, twice the longest hold) without faults
				NewLocker: func(t *testing.T, w Worker) locker.Locker { return memlock.NewStore().NewLocker() },
			})
			if r == nil {
				return // the worker process
			}
			if r.Acquired == 0 || r.Faults["holder-pause"] == 0 {
				t.Errorf("the run exercised too little: %v", r)
			}
			for _, h := range r.Holds {
				if !slices.Contains(c.modes, h.Mode) {
					t.Fatalf("a hold of mode %q in a %v run", h.Mode, c.fam)
				}
			}
		})
	}
}

// hideFamilyLoss is hideLoss for the families: its permits and read and
// write locks never report a lost lock.
type hideFamilyLoss struct{ locker.Locker }

func hidden(h locker.Handle, err error) (locker.Handle, error) {
	if err != nil {
		return nil, err
	}
	return &hiddenHandle{Handle: h, done: make(chan struct{})}, nil
}

func (l hideFamilyLoss) AcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	return hidden(l.Locker.(locker.Semaphorer).AcquireSemaphore(ctx, key, n, opts...))
}

func (l hideFamilyLoss) TryAcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	return hidden(l.Locker.(locker.Semaphorer).TryAcquireSemaphore(ctx, key, n, opts...))
}

func (l hideFamilyLoss) AcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return hidden(l.Locker.(locker.ReadWriter).AcquireRead(ctx, key, opts...))
}

func (l hideFamilyLoss) TryAcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return hidden(l.Locker.(locker.ReadWriter).TryAcquireRead(ctx, key, opts...))
}

func (l hideFamilyLoss) AcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return hidden(l.Locker.(locker.ReadWriter).AcquireWrite(ctx, key, opts...))
}

func (l hideFamilyLoss) TryAcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return hidden(l.Locker.(locker.ReadWriter).TryAcquireWrite(ctx, key, opts...))
}

// TestCatchesHiddenFamilyLoss: across processes, a family whose holders
// are never told of a loss (a frozen holder's permit or lock goes to
// another, and it learns nothing) fails the checks. On one key, so that
// the lock of a frozen holder is always taken: it skips, saying so, until
// sqltable has the family.
func TestCatchesHiddenFamilyLoss(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		fam  Family
	}{{"Semaphore", Semaphore(semLimit)}, {"ReadWrite", ReadWrite()}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := sqliteHarness(t, func(l locker.Locker) locker.Locker { return hideFamilyLoss{l} })
			h.Family, h.Keys, h.Duration, h.Settle = c.fam, 1, testDuration, 2*time.Second
			skipWithoutFamily(t, c.fam)
			r := exercise(t, h)
			if r == nil {
				return // a worker process
			}
			if !hasViolation(r, "never reported") {
				t.Errorf("an SQLite %v that hides lost locks passed the checks: %v\n%s", c.fam, r, strings.Join(r.Violations, "\n"))
			}
			t.Logf("caught: %v (%d violations; the first: %s)", r, len(r.Violations), first(r.Violations))
		})
	}
}

// skipWithoutFamily skips t, in the test process, while sqltable's Locker
// lacks fam.
func skipWithoutFamily(t *testing.T, fam Family) {
	if isWorkerProcess(t) {
		return
	}
	l, err := sqltable.Open(context.Background(), "sqlite://"+filepath.Join(t.TempDir(), "probe.db"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = fam.views(l)
	_ = l.Close()
	if err != nil {
		t.Skipf("skipped until sqltable has the family: %v", err)
	}
}
