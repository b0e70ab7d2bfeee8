package conformance_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/memlock"
)

// Broken lock families, made by wrapping memlock's correct ones: the
// Semaphore/* and RW/* cases must catch each. (memlock's own run of the
// suite, in its package, is the control.)

type familyFlaw int

const (
	semOverAdmits      familyFlaw = iota + 1 // a semaphore of n lets n+1 in
	semRacy                                  // a semaphore that counts its holders, then admits: n+1 get in under a race
	semIgnoresMismatch                       // a second limit on a held key is obeyed silently (the first one wins)
	writerAsReader                           // a write lock is a read lock: a writer is admitted beside readers
	readerAsWriter                           // a read lock is a write lock: readers exclude each other
	semSharedTokens                          // two permits of a key can carry one token (token rounded down to even)
)

var familyFlaws = []struct {
	name   string
	flaw   familyFlaw
	caught []string
}{
	{"SemOverAdmits", semOverAdmits, []string{"Semaphore/AdmitsN"}},
	{"SemRacy", semRacy, []string{"Semaphore/Contended"}},
	{"SemIgnoresMismatch", semIgnoresMismatch, []string{"Semaphore/LimitMismatch"}},
	{"WriterAsReader", writerAsReader, []string{"RW/ReadersShare", "RW/WriterExcludes", "RW/Contended"}},
	{"ReaderAsWriter", readerAsWriter, []string{"RW/ReadersShare"}},
	{"SemSharedTokens", semSharedTokens, []string{"Semaphore/Contended"}},
}

// familyMutant is a memlock Locker whose families have one flaw.
type familyMutant struct {
	*memlock.Locker
	flaw   familyFlaw
	shared *mutantShared
}

// mutantShared is what the mutants of one run share, as clients of one
// server would.
type mutantShared struct {
	mu     sync.Mutex
	limits map[string]int // semIgnoresMismatch: the first limit asked per key
	count  map[string]int // semRacy: holders per key, as the racy semaphore counts them
}

func (m *familyMutant) limit(key string, n int) int {
	switch m.flaw {
	case semOverAdmits:
		return n + 1
	case semIgnoresMismatch:
		m.shared.mu.Lock()
		defer m.shared.mu.Unlock()
		if first, ok := m.shared.limits[key]; ok {
			return first
		}
		m.shared.limits[key] = n
	}
	return n
}

func (m *familyMutant) AcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	if m.flaw == semRacy && n >= 1 {
		return m.racy(ctx, key, n, true, opts)
	}
	h, err := m.Locker.AcquireSemaphore(ctx, key, m.limit(key, n), opts...)
	if err == nil && m.flaw == semSharedTokens {
		h = evenToken{h}
	}
	return h, err
}

// evenToken is a permit whose token is rounded down to an even number: two
// permits granted one after the other share it.
type evenToken struct{ locker.Handle }

func (h evenToken) Token() int64 { return h.Handle.Token() &^ 1 }

func (m *familyMutant) TryAcquireSemaphore(ctx context.Context, key string, n int, opts ...locker.Option) (locker.Handle, error) {
	if m.flaw == semRacy && n >= 1 {
		return m.racy(ctx, key, n, false, opts)
	}
	return m.Locker.TryAcquireSemaphore(ctx, key, m.limit(key, n), opts...)
}

// racy admits a caller when it counts fewer than n holders, then counts it
// in: between the two, others are admitted too.
func (m *familyMutant) racy(ctx context.Context, key string, n int, wait bool, opts []locker.Option) (locker.Handle, error) {
	s := m.shared
	for {
		s.mu.Lock()
		c := s.count[key]
		s.mu.Unlock()
		if c < n {
			time.Sleep(time.Millisecond) // the window of the race
			s.mu.Lock()
			s.count[key]++
			s.mu.Unlock()
			h, err := m.Locker.TryAcquireSemaphore(ctx, key, 1000, opts...)
			if err != nil {
				return nil, err
			}
			return &countedHandle{Handle: h, release: func() { s.mu.Lock(); s.count[key]--; s.mu.Unlock() }}, nil
		}
		if !wait {
			return nil, &locker.Error{Op: "try-acquire-semaphore", Key: key, Err: locker.ErrNotAcquired}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// countedHandle tells the racy semaphore's count when it is released.
type countedHandle struct {
	locker.Handle
	once    sync.Once
	release func()
}

func (h *countedHandle) Release(ctx context.Context) error {
	h.once.Do(h.release)
	return h.Handle.Release(ctx)
}

func (m *familyMutant) AcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	if m.flaw == readerAsWriter {
		return m.Locker.AcquireWrite(ctx, key, opts...)
	}
	return m.Locker.AcquireRead(ctx, key, opts...)
}

func (m *familyMutant) TryAcquireRead(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	if m.flaw == readerAsWriter {
		return m.Locker.TryAcquireWrite(ctx, key, opts...)
	}
	return m.Locker.TryAcquireRead(ctx, key, opts...)
}

func (m *familyMutant) AcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	if m.flaw == writerAsReader {
		return m.Locker.AcquireRead(ctx, key, opts...)
	}
	return m.Locker.AcquireWrite(ctx, key, opts...)
}

func (m *familyMutant) TryAcquireWrite(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	if m.flaw == writerAsReader {
		return m.Locker.TryAcquireRead(ctx, key, opts...)
	}
	return m.Locker.TryAcquireWrite(ctx, key, opts...)
}

const familyFlawEnv = "LOCKER_CONFORMANCE_FAMILY_FLAW"

// TestFlawedFamilies is run by TestSuiteCatchesFamilyFlaws in a child
// process, as TestFlawedToy is.
func TestFlawedFamilies(t *testing.T) {
	name := os.Getenv(familyFlawEnv)
	if name == "" {
		t.Skip("runs only as a child of TestSuiteCatchesFamilyFlaws")
	}
	for _, f := range familyFlaws {
		if f.name != name {
			continue
		}
		store := memlock.NewStore()
		shared := &mutantShared{limits: map[string]int{}, count: map[string]int{}}
		conformance.Run(t, conformance.Harness{
			NewLocker: func(t *testing.T) locker.Locker {
				return &familyMutant{Locker: store.NewLocker(), flaw: f.flaw, shared: shared}
			},
			InProcess: true,
			TTL:       locker.MinTTL,
		})
		return
	}
	t.Fatalf("unknown flaw %q", name)
}

// TestSuiteCatchesFamilyFlaws proves that the family cases can fail: each
// broken family must make Run fail in the cases meant to catch it.
func TestSuiteCatchesFamilyFlaws(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child test binary per flaw")
	}
	for _, f := range familyFlaws {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			pattern := strings.Replace(runPattern(f.caught), "TestFlawedToy", "TestFlawedFamilies", 1)
			cmd := exec.Command(os.Args[0], "-test.run="+pattern, "-test.v", "-test.timeout=5m")
			cmd.Env = append(os.Environ(), familyFlawEnv+"="+f.name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("Run passed a locker with flaw %s; output:\n%s", f.name, tail(out))
			}
			for _, c := range f.caught {
				if !strings.Contains(string(out), "--- FAIL: TestFlawedFamilies/"+c+" ") {
					t.Errorf("flaw %s was not caught by %s; output:\n%s", f.name, c, tail(out))
				}
			}
			if strings.Contains(string(out), "panic:") {
				t.Errorf("flaw %s made the suite panic instead of fail; output:\n%s", f.name, tail(out))
			}
		})
	}
}
