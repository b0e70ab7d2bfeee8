package conformance_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
)

func toyHarness(f flaw) conformance.Harness {
	store := newToyStore()
	h := conformance.Harness{
		NewLocker: func(t *testing.T) locker.Locker { return newToy(store, f) },
		NewLockerWithTokenBase: func(t *testing.T, n int64) (locker.Locker, error) {
			return newToyWithTokenBase(store, f, n)
		},
		Crash: func(t *testing.T, l locker.Locker) { l.(*toyLocker).crash() },
		Steal: func(t *testing.T, h locker.Handle) { store.steal(h.(*toyHandle)) },
		Reset: func(t *testing.T, l locker.Locker) { l.(*toyLocker).reset() },
		// The toy is an in-process map; processLocal forgets to say so.
		InProcess: f != processLocal,
		Cut: func(t *testing.T, l locker.Locker) func() {
			l.(*toyLocker).setCut(true)
			return func() { l.(*toyLocker).setCut(false) }
		},
		TTL:      locker.MinTTL,
		ManyKeys: 500,
		Unsafe: []conformance.UnsafeConfig{
			{
				Name:    "store=private",
				Mention: "store=private",
				New: func(t *testing.T) (locker.Locker, error) {
					if f != acceptsPrivateStore {
						return nil, errToyPrivate
					}
					return newToy(newToyStore(), f), nil
				},
			},
			{
				// The toy's own configuration, made safe by being what it is:
				// it proves the MadeSafe check passes a locker that keeps the
				// contract.
				Name:     "made-safe",
				MadeSafe: true,
				New:      func(t *testing.T) (locker.Locker, error) { return newToy(store, f), nil },
			},
		},
	}
	if f == sessionResetSilent {
		// The allowance a backend whose locks end with their connection
		// gets must not let a holder that never hears of the loss pass.
		h.ResetEndsLocks = "the toy's reset frees its locks, as a session backend's does"
	}
	return h
}

// TestToy runs the suite on the flawless toy: the control for the flaws below.
func TestToy(t *testing.T) {
	conformance.Run(t, toyHarness(noFlaw))
}

var flaws = []struct {
	name   string
	flaw   flaw
	caught []string // cases that must fail
}{
	{"NoExclusion", noExclusion, []string{"Acquire/MutualExclusion", "TryAcquire/Held"}},
	{"ConstantToken", constantToken, []string{"Acquire/MutualExclusion", "Fencing/AfterRelease"}},
	{"PerLockerToken", perLockerToken, []string{"Acquire/MutualExclusion", "Fencing/AfterRelease"}},
	{"BlindRelease", blindRelease, []string{"Release/NotOwner"}},
	{"OwnerPerLocker", ownerPerLocker, []string{"Release/Twice"}},
	{"IgnoresContext", ignoresContext, []string{"Context/CancelWhileWaiting", "Context/DeadlineWhileWaiting"}},
	{"SilentLoss", silentLoss, []string{"Loss/DoneOnCut", "Release/AfterLoss"}},
	{"TryWaits", tryWaits, []string{"TryAcquire/Held"}},
	{"PollingWaiter", pollingWaiter, []string{"Acquire/WaitsForRelease"}},
	{"TruncatedKeys", truncatedKeys, []string{"Keys/Unusual"}},
	{"CloseKeepsLocks", closeKeepsLocks, []string{"Close/ReleasesHeld"}},
	{"ReleaseIgnoresCtx", releaseIgnoresCtx, []string{"Release/WhileCut"}},
	{"RacyRelease", racyRelease, []string{"Release/Concurrent"}},
	{"BlindRenewal", blindRenewal, []string{"Release/StopsRenewal"}},
	{"RetriesUnreachable", retriesUnreachable, []string{"Context/DeadlineWhileCut", "Context/CancelWhileCut"}},
	{"CheckedBlindRelease", checkedBlindRelease, []string{"Steal/ReleaseKeepsNewHolder"}},
	{"CheckedBlindRenewal", checkedBlindRenewal, []string{"Steal/RenewalDoesNotExtend", "Steal/LossReported"}},
	{"ProcessLocal", processLocal, []string{"Process/Exclusion", "Process/KilledHolder"}},
	{"RacyTry", racyTry, []string{"TryAcquire/Burst"}},
	{"OutageNotAcquired", outageNotAcquired, []string{"Context/DeadlineWhileCut", "Context/CancelWhileCut"}},
	{"FailedReleaseNil", failedReleaseNil, []string{"Release/WhileCut"}},
	{"LateCtx", lateCtx, []string{"Context/CancelWhileWaiting", "Context/DeadlineWhileWaiting"}},
	{"LostWakeup", lostWakeup, []string{"Waiters/WaiterCancelled"}},
	{"CloseWaitsInFlight", closeWaitsInFlight, []string{"Close/WhileInFlight"}},
	{"AcceptsPrivateStore", acceptsPrivateStore, []string{"Config/UnsafeRefused"}},
	{"FaultGrantsWaiter", faultGrantsWaiter, []string{"Waiters/WaiterCut", "Waiters/WaiterCrashes"}},
	{"StrandsCutWaiter", strandsCutWaiter, []string{"Waiters/SessionLapse"}},
	{"ResetFreesSilently", resetFreesSilently, []string{"Loss/ConnectionsReset"}},
	{"SessionResetSilent", sessionResetSilent, []string{"Loss/ConnectionsReset"}},
	{"DropsCause", dropsCause, []string{"Context/Cause"}},
	{"CloseCutClaimsRelease", closeCutClaimsRelease, []string{"Close/WhileCut"}},
	{"RefusesLongTTL", refusesLongTTL, []string{"TTL/Range"}},
	{"RoundsLeaseUp", roundsLeaseUp, []string{"TTL/Range", "TTL/Default"}},
	{"OwnDefaultTTL", ownDefaultTTL, []string{"TTL/Default"}},
	{"OutlivesLease", outlivesLease, []string{"TTL/SilentHolder"}},
	{"InspectNoLease", inspectNoLease, []string{"TTL/Range", "TTL/Default"}},
	{"OwnerLingers", ownerLingers, []string{"Inspect/Owner"}},
	{"IgnoresBadTTL", ignoresBadTTL, []string{"Options/InvalidTTL", "Options/HugeTTL"}},
	{"IgnoresTokenBase", ignoresTokenBase, []string{"Fencing/TokenBase"}},
	{"FloorsTokenBase", floorsTokenBase, []string{"Fencing/TokenBase"}},
	{"InspectIgnoresTokenBase", inspectIgnoresTokenBase, []string{"Fencing/TokenBase"}},
	{"AcceptsBadTokenBase", acceptsBadTokenBase, []string{"Fencing/TokenBase"}},
	{"SharedRenewalFate", sharedRenewalFate, []string{"Steal/OthersKept"}},
}

const flawEnv = "LOCKER_CONFORMANCE_FLAW"

// TestFlawedToy is run by TestSuiteCatchesFlaws in a child process, because
// a failing Run must fail a test binary of its own, not this one.
func TestFlawedToy(t *testing.T) {
	name := os.Getenv(flawEnv)
	if name == "" {
		t.Skip("runs only as a child of TestSuiteCatchesFlaws")
	}
	for _, f := range flaws {
		if f.name == name {
			conformance.Run(t, toyHarness(f.flaw))
			return
		}
	}
	t.Fatalf("unknown flaw %q", name)
}

// TestSuiteCatchesFlaws proves that the suite can fail: each deliberately
// broken locker must make Run fail, in the cases meant to catch its flaw.
func TestSuiteCatchesFlaws(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child test binary per flaw")
	}
	for _, f := range flaws {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run="+runPattern(f.caught), "-test.v", "-test.timeout=5m")
			cmd.Env = append(os.Environ(), flawEnv+"="+f.name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("Run passed a locker with flaw %s; output:\n%s", f.name, tail(out))
			}
			for _, c := range f.caught {
				if !strings.Contains(string(out), "--- FAIL: TestFlawedToy/"+c+" ") {
					t.Errorf("flaw %s was not caught by %s; output:\n%s", f.name, c, tail(out))
				}
			}
			if strings.Contains(string(out), "panic:") {
				t.Errorf("flaw %s made the suite panic instead of fail; output:\n%s", f.name, tail(out))
			}
		})
	}
}

// runPattern selects the cases named in caught (and perhaps a few more that
// share their area or case names): some flaws make every case slow.
func runPattern(caught []string) string {
	var areas, cases []string
	for _, c := range caught {
		area, name, _ := strings.Cut(c, "/")
		areas = append(areas, regexp.QuoteMeta(area))
		cases = append(cases, regexp.QuoteMeta(name))
	}
	return "^TestFlawedToy$/^(" + strings.Join(areas, "|") + ")$/^(" + strings.Join(cases, "|") + ")$"
}

func tail(b []byte) string {
	const n = 6000
	if len(b) > n {
		return "…" + string(b[len(b)-n:])
	}
	return string(b)
}
