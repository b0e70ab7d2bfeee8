package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-locker/locker"
)

// prompt bounds every call that must not wait for another holder: a failed
// TryAcquire, an Acquire whose context has ended, a rejected key or option.
// It is generous on purpose: it separates "returns" from "hangs", not fast
// from slow.
const prompt = 5 * time.Second

// quick bounds the fastest of a few calls that make one round trip to the
// backend and must not wait for another holder, such as a TryAcquire of a
// held key. It catches calls that retry or wait every time, while one slow
// round trip on a loaded machine does not fail a case.
const quick = 500 * time.Millisecond

// EnvFull, set to anything, makes Run ignore Harness.Only: every case runs.
const EnvFull = "LOCKER_CONFORMANCE_FULL"

// Run runs the conformance suite against the backend h describes. It fails t
// for every broken promise, and skips, visibly, the cases whose hooks h lacks.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.NewLocker == nil {
		t.Fatal("conformance: Harness.NewLocker is required")
	}
	if os.Getenv(childKeyEnv) != "" && os.Getenv(childRunEnv) == t.Name() {
		runChild(t, h.withDefaults())
		return
	}
	s := &suite{h: h.withDefaults(), runName: t.Name()}
	cases := s.cases()
	for name := range h.Skip {
		if !slices.ContainsFunc(cases, func(c testCase) bool { return c.name == name }) {
			t.Errorf("conformance: Harness.Skip names %q, which is no case of the suite", name)
		}
	}
	cases, unknown := only(cases, h.Only, os.Getenv(EnvFull) != "")
	for _, name := range unknown {
		t.Errorf("conformance: Harness.Only names %q, which is no area or case of the suite", name)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if why, ok := s.h.Skip[c.name]; ok {
				t.Skipf("conformance: skipped by Harness.Skip: %s", why)
			}
			s.runCase(t, c)
		})
	}
}

// only keeps the cases that names select (an area, or a case as
// "Area/Case"), all of them when names is empty or full is set, and
// returns the names that select nothing.
func only(cases []testCase, names []string, full bool) (kept []testCase, unknown []string) {
	match := func(c testCase, name string) bool { return c.name == name || strings.HasPrefix(c.name, name+"/") }
	for _, name := range names {
		if !slices.ContainsFunc(cases, func(c testCase) bool { return match(c, name) }) {
			unknown = append(unknown, name)
		}
	}
	if len(names) == 0 || full {
		return cases, unknown
	}
	for _, c := range cases {
		if slices.ContainsFunc(names, func(name string) bool { return match(c, name) }) {
			kept = append(kept, c)
		}
	}
	return kept, unknown
}

func (h Harness) withDefaults() Harness {
	if h.TTL <= 0 {
		h.TTL = 2 * time.Second
	}
	if h.ExpiryBound <= 0 {
		h.ExpiryBound = 3 * h.TTL
	}
	if h.ManyKeys <= 0 {
		h.ManyKeys = 2000
	}
	if h.Contenders <= 0 {
		h.Contenders = 4
	}
	if h.Goroutines <= 0 {
		h.Goroutines = 4
	}
	if h.HandoffBound <= 0 {
		h.HandoffBound = time.Second
	}
	if h.LossBound <= 0 {
		h.LossBound = h.TTL
	}
	if h.ExpirySlack <= 0 {
		h.ExpirySlack = time.Second
	}
	if h.CtxSlack <= 0 {
		h.CtxSlack = 500 * time.Millisecond
	}
	if h.CaseTimeout <= 0 {
		h.CaseTimeout = max(60*time.Second, 4*h.ExpiryBound+4*h.TTL)
	}
	return h
}

type suite struct {
	h       Harness
	runName string // the name of the test that called Run, for child processes
}

type testCase struct {
	name string
	fn   func(t *testing.T, ctx context.Context)
}

func (s *suite) cases() []testCase {
	return []testCase{
		{"Handle/Accessors", s.handleAccessors},
		{"Acquire/MutualExclusion", s.mutualExclusion},
		{"Acquire/WaitsForRelease", s.waitsForRelease},
		{"Acquire/NotReentrant", s.notReentrant},
		{"TryAcquire/Held", s.tryAcquireHeld},
		{"TryAcquire/Burst", s.tryBurst},
		{"Keys/Independent", s.keysIndependent},
		{"Keys/ManyHeld", s.manyHeld},
		{"Keys/Unusual", s.unusualKeys},
		{"Keys/Invalid", s.invalidKeys},
		{"Options/InvalidTTL", s.invalidTTL},
		{"Options/HugeTTL", s.hugeTTL},
		{"TTL/Range", s.ttlRange},
		{"TTL/Default", s.ttlDefault},
		{"TTL/SilentHolder", s.ttlSilentHolder},
		{"Release/Twice", s.releaseTwice},
		{"Release/Concurrent", s.releaseConcurrent},
		{"Release/AfterLoss", s.releaseAfterLoss},
		{"Release/NotOwner", s.releaseNotOwner},
		{"Release/WhileCut", s.releaseWhileCut},
		{"Release/StopsRenewal", s.releaseStopsRenewal},
		{"Steal/ReleaseKeepsNewHolder", s.stealReleaseKeepsNewHolder},
		{"Steal/RenewalDoesNotExtend", s.stealRenewalDoesNotExtend},
		{"Steal/LossReported", s.stealLossReported},
		{"Steal/OthersKept", s.stealOthersKept},
		{"Fencing/AfterRelease", s.fencingAfterRelease},
		{"Fencing/AfterCrash", s.fencingAfterCrash},
		{"Fencing/TokenBase", s.fencingTokenBase},
		{"Loss/DoneOnCut", s.doneOnCut},
		{"Loss/RenewalKeepsLock", s.renewalKeepsLock},
		{"Loss/ShortCutKeepsLock", s.shortCutKeepsLock},
		{"Loss/AtRiskThenCleared", s.atRiskThenCleared},
		{"Loss/ConnectionsReset", s.connectionsReset},
		{"Waiters/WaiterCancelled", s.waiterCancelled},
		{"Waiters/WaiterCut", s.waiterCut},
		{"Waiters/WaiterCrashes", s.waiterCrashes},
		{"Waiters/Many", s.waitersMany},
		{"Waiters/SessionLapse", s.waiterLapses},
		{"Process/Exclusion", s.processExclusion},
		{"Process/KilledHolder", s.processKilled},
		{"Process/PausedHolder", s.pausedHolder},
		{"Context/CancelledBeforeCall", s.cancelledBeforeCall},
		{"Context/CancelWhileWaiting", s.cancelWhileWaiting},
		{"Context/DeadlineWhileWaiting", s.deadlineWhileWaiting},
		{"Context/DeadlineWhileCut", s.deadlineWhileCut},
		{"Context/CancelWhileCut", s.cancelWhileCut},
		{"Context/Cause", s.cancelCause},
		{"Close/ReleasesHeld", s.closeReleasesHeld},
		{"Close/WakesOwnWaiters", s.closeWakesOwnWaiters},
		{"Close/WhileInFlight", s.closeWhileInFlight},
		{"Close/WhileCut", s.closeWhileCut},
		{"Close/NoGoroutineLeak", s.noGoroutineLeak},
		{"Inspect/Lifecycle", s.inspectLifecycle},
		{"Inspect/AfterCrash", s.inspectAfterCrash},
		{"Inspect/BadKey", s.inspectBadKey},
		{"Inspect/Owner", s.inspectOwner},
		{"Semaphore/AdmitsN", s.semAdmitsN},
		{"Semaphore/Contended", s.semContended},
		{"Semaphore/LimitMismatch", s.semLimitMismatch},
		{"Semaphore/InvalidLimit", s.semInvalidLimit},
		{"Semaphore/Waiter", s.semWaiter},
		{"Semaphore/Crash", s.semCrash},
		{"RW/ReadersShare", s.rwReadersShare},
		{"RW/WriterExcludes", s.rwWriterExcludes},
		{"RW/WriterNotStarved", s.rwWriterNotStarved},
		{"RW/CancelledWriter", s.rwCancelledWriter},
		{"RW/Contended", s.rwContended},
		{"RW/Crash", s.rwCrash},
		{"Families/Apart", s.familiesApart},
		{"Multi/AllOrNothing", s.multiAllOrNothing},
		{"Multi/OppositeOrders", s.multiOppositeOrders},
		{"Multi/WaitCancelled", s.multiWaitCancelled},
		{"Multi/Loss", s.multiLoss},
		{"Multi/BadKeys", s.multiBadKeys},
		{"Config/UnsafeRefused", s.unsafeRefused},
		{"Open/Works", s.openWorks},
		{"Open/RejectsUnknownParameter", s.openRejectsUnknown},
		{"Open/HidesPassword", s.openHidesPassword},
	}
}

// runCase runs one case with its deadline. The context it gets ends at the
// deadline, which ends every well-behaved wait; a backend that ignores it and
// hangs is caught by a timer that dumps all goroutines and aborts the binary,
// because a hung test goroutine cannot be stopped any other way.
func (s *suite) runCase(t *testing.T, c testCase) {
	ctx, cancel := context.WithTimeout(context.Background(), s.h.CaseTimeout)
	defer cancel()
	grace := s.h.CaseTimeout + 30*time.Second
	timer := time.AfterFunc(grace, func() {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		fmt.Fprintf(os.Stderr, "conformance: %s did not finish within %v (deadlock?); goroutines:\n%s\n", t.Name(), grace, buf[:n])
		panic(fmt.Sprintf("conformance: %s did not finish within %v", t.Name(), grace))
	})
	defer timer.Stop()
	c.fn(t, ctx)
}

// newLocker returns a new client that is closed when the test ends.
func (s *suite) newLocker(t *testing.T) locker.Locker {
	t.Helper()
	l := s.h.NewLocker(t)
	if l == nil {
		t.Fatal("conformance: Harness.NewLocker returned nil")
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// key returns a key unique to this test and this run, so that cases never
// see each other's locks even on a server shared with other test binaries.
func key(t *testing.T, suffix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "conformance/" + t.Name() + "/" + hex.EncodeToString(b[:]) + suffix
}

func ttl(s *suite) locker.Option { return locker.WithTTL(s.h.TTL) }

// mustAcquire acquires key or fails the test.
func mustAcquire(t *testing.T, ctx context.Context, l locker.Locker, key string, opts ...locker.Option) locker.Handle {
	t.Helper()
	h, err := l.Acquire(ctx, key, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", key, err)
	}
	checkHeld(t, h, key)
	return h
}

// mustTry makes one TryAcquire that must succeed.
func mustTry(t *testing.T, ctx context.Context, l locker.Locker, key string, opts ...locker.Option) locker.Handle {
	t.Helper()
	h, err := l.TryAcquire(ctx, key, opts...)
	if err != nil {
		t.Fatalf("TryAcquire(%q) on a free key: %v", key, err)
	}
	checkHeld(t, h, key)
	return h
}

// checkHeld checks what a fresh handle must say of itself.
func checkHeld(t *testing.T, h locker.Handle, key string) {
	t.Helper()
	if h == nil {
		t.Fatalf("acquiring %q returned a nil Handle and no error", key)
	}
	if h.Key() != key {
		t.Errorf("Handle.Key() = %q, want %q", h.Key(), key)
	}
	if h.Token() <= 0 {
		t.Errorf("Handle.Token() = %d for %q, want a positive fencing token", h.Token(), key)
	}
	if err := h.Err(); err != nil {
		t.Errorf("Handle.Err() of a fresh lock on %q = %v, want nil", key, err)
	}
	if isClosed(h.Done()) {
		t.Errorf("Handle.Done() of a fresh lock on %q is already closed", key)
	}
}

// mustNotTry makes one TryAcquire that must fail with ErrNotAcquired, promptly,
// and returns how long it took.
func mustNotTry(t *testing.T, ctx context.Context, l locker.Locker, key, why string) time.Duration {
	t.Helper()
	start := time.Now()
	h, err := l.TryAcquire(ctx, key)
	took := time.Since(start)
	if err == nil {
		_ = h.Release(ctx)
		t.Fatalf("TryAcquire(%q) succeeded although %s", key, why)
	}
	if !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire(%q) while %s: error %v does not wrap locker.ErrNotAcquired", key, why, err)
	}
	checkKeyError(t, err, key, "TryAcquire of a held key")
	if took > prompt {
		t.Errorf("TryAcquire(%q) on a held key took %v; it must not wait for the holder", key, took)
	}
	return took
}

func mustRelease(t *testing.T, ctx context.Context, h locker.Handle) {
	t.Helper()
	if err := h.Release(ctx); err != nil {
		t.Fatalf("Release(%q): %v", h.Key(), err)
	}
	if !isClosed(h.Done()) {
		t.Errorf("Done() of %q not closed after Release", h.Key())
	}
	if err := h.Err(); !errors.Is(err, locker.ErrReleased) {
		t.Errorf("Err() of %q after Release = %v, want locker.ErrReleased", h.Key(), err)
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// result is the outcome of an Acquire run in the background.
type result struct {
	h   locker.Handle
	err error
	at  time.Time
}

// goAcquire starts Acquire in a goroutine and returns where its result goes.
func goAcquire(ctx context.Context, l locker.Locker, key string, opts ...locker.Option) <-chan result {
	ch := make(chan result, 1)
	go func() {
		h, err := l.Acquire(ctx, key, opts...)
		ch <- result{h, err, time.Now()}
	}()
	return ch
}

// await waits at most d for a background Acquire.
func await(t *testing.T, ch <-chan result, d time.Duration, what string) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(d):
		t.Fatalf("%s: no result within %v", what, d)
		return result{}
	}
}

// stillWaiting gives a background Acquire time to reach its wait (there is no
// signal for "now waiting" in the contract), then checks it has not returned.
func stillWaiting(t *testing.T, ch <-chan result, what string) {
	t.Helper()
	select {
	case r := <-ch:
		if r.err == nil {
			_ = r.h.Release(context.Background())
			t.Fatalf("%s: acquired a key that another holder has", what)
		}
		t.Fatalf("%s: returned early with %v", what, r.err)
	case <-time.After(200 * time.Millisecond):
	}
}

// waitDone waits at most d for h to report that it is no longer held.
func waitDone(t *testing.T, h locker.Handle, d time.Duration, what string) {
	t.Helper()
	select {
	case <-h.Done():
	case <-time.After(d):
		t.Fatalf("%s: Done() of %q not closed within %v", what, h.Key(), d)
	}
}

// truncate shortens a key for a message, keeping its head and its tail
// (long keys in the suite often differ only at the end).
func truncate(s string) string {
	s = strings.ToValidUTF8(s, "?")
	const head, tail = 40, 12
	if len(s) <= head+tail+10 {
		return s
	}
	h, t := head, len(s)-tail
	for !utf8.RuneStart(s[h]) {
		h--
	}
	for !utf8.RuneStart(s[t]) {
		t++
	}
	return fmt.Sprintf("%s…%s (%d bytes)", s[:h], s[t:], len(s))
}
