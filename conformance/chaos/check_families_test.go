package chaos

import (
	"testing"
	"time"
)

// Synthetic histories of the family runs: each check must flag the flaw it
// is for, and pass the same history without it.

func acqM(w, seq int, mode, key string, tok, inv, done int64) event {
	e := acq(w, seq, key, tok, inv, done)
	e.Mode = mode
	return e
}

func leave(w, seq int, key string, tok, inv, done int64) event {
	return event{W: w, Op: opLeave, Seq: seq, Key: key, Tok: tok, Inv: inv * ms, Done: done * ms, OK: true}
}

// rdTok is a reader-writer read: served (fence and val are what it
// returned) or refused.
func rdTok(w, seq int, key string, tok, fence, val, inv, done int64, ok bool) event {
	return event{W: w, Op: opRead, Seq: seq, Key: key, Tok: tok, Fence: fence, Val: val, Inv: inv * ms, Done: done * ms, OK: ok}
}

func runFamCheck(f Family, evs []event, freezes map[int][][2]int64) *Report {
	r := &Report{Faults: map[string]int{}}
	check(r, history{family: f, events: evs, freezes: freezes, ttl: time.Second, keys: []string{"k"}, settleStart: 0, settle: time.Second})
	return r
}

// semHolds: a semaphore of 2; 0 and 1 hold together, 2 takes 0's permit
// after 0 left and released.
func semHolds() []event {
	return []event{
		acqM(0, 0, modePermit, "k", 1, 0, 1), wr(0, 0, "k", 1, 10, 2, 3, true), leave(0, 0, "k", 1, 30, 31), rel(0, 0, "k", 1, 32, 33, false),
		acqM(1, 0, modePermit, "k", 2, 4, 5), wr(1, 0, "k", 2, 20, 6, 7, true), wr(1, 0, "k", 2, 21, 50, 51, true), leave(1, 0, "k", 2, 52, 53), rel(1, 0, "k", 2, 54, 55, false),
		acqM(2, 0, modePermit, "k", 3, 20, 34), wr(2, 0, "k", 3, 30, 35, 36, true), leave(2, 0, "k", 3, 60, 61), rel(2, 0, "k", 3, 62, 63, false),
	}
}

func TestSemCheckClean(t *testing.T) { wantClean(t, runFamCheck(Semaphore(2), semHolds(), nil)) }

func TestSemCheckTokens(t *testing.T) {
	evs := semHolds()
	for i := 9; i < 13; i++ {
		evs[i].Tok = 2 // 2's permit has 1's token
	}
	wantViolation(t, runFamCheck(Semaphore(2), evs, nil), "given twice")
}

// semThree: 2 is acquired at 20 while 0 and 1 still hold.
func semThree() []event {
	return []event{
		acqM(0, 0, modePermit, "k", 1, 0, 1), rel(0, 0, "k", 1, 40, 41, true),
		acqM(1, 0, modePermit, "k", 2, 4, 5), rel(1, 0, "k", 2, 54, 55, false),
		acqM(2, 0, modePermit, "k", 3, 10, 20), rel(2, 0, "k", 3, 62, 63, false),
	}
}

func TestSemCheckLimit(t *testing.T) {
	wantViolation(t, runFamCheck(Semaphore(2), semThree(), nil), "more holders than a semaphore of 2 admits")
	// Three fit a semaphore of 3.
	wantClean(t, runFamCheck(Semaphore(3), semThree(), nil))
	// 0 was told of its loss before 2 was acquired: fine.
	wantClean(t, runFamCheck(Semaphore(2), append(semThree(), lostAt(0, 0, "k", 1, 15)), nil))
	// Told too late.
	wantViolation(t, runFamCheck(Semaphore(2), append(semThree(), lostAt(0, 0, "k", 1, 25+observeSlack.Milliseconds())), nil), "more holders")
	// 0 was frozen, and said so at Release: fine.
	frozen := map[int][][2]int64{0: {{3 * ms, 22 * ms}}}
	wantClean(t, runFamCheck(Semaphore(2), semThree(), frozen))
	// Frozen, and never said so: its loss was hidden.
	evs := semThree()
	evs[1] = rel(0, 0, "k", 1, 40, 41, false)
	wantViolation(t, runFamCheck(Semaphore(2), evs, frozen), "none of the frozen ones")
}

// semEvict: 0, 1 and 2 write together; the register cuts 0 off for 2.
func semEvict() []event {
	e := wr(2, 0, "k", 3, 30, 21, 22, true)
	e.Evicted, e.Full = 1, []int64{1, 2}
	return []event{
		acqM(0, 0, modePermit, "k", 1, 0, 1), wr(0, 0, "k", 1, 10, 2, 3, true), rel(0, 0, "k", 1, 40, 41, true),
		acqM(1, 0, modePermit, "k", 2, 4, 5), wr(1, 0, "k", 2, 20, 6, 7, true), leave(1, 0, "k", 2, 52, 53), rel(1, 0, "k", 2, 54, 55, false),
		acqM(2, 0, modePermit, "k", 3, 10, 20), e, leave(2, 0, "k", 3, 60, 61), rel(2, 0, "k", 3, 62, 63, false),
	}
}

func TestSemCheckRegisterClaimants(t *testing.T) {
	// 0 lost its permit (told at 15) before 2 was granted it: the register
	// cut the stale writer off, as it should.
	r := runFamCheck(Semaphore(2), append(semEvict(), lostAt(0, 0, "k", 1, 15)), nil)
	wantClean(t, r)
	if r.Evicted != 1 {
		t.Errorf("Evicted = %d, want 1", r.Evicted)
	}
	// Nobody had lost a permit: the register saw three writers of a
	// semaphore of 2.
	wantViolation(t, runFamCheck(Semaphore(2), semEvict(), nil), "none of which had lost its permit")
	// A refusal for the same reason: 0 writes when 1 and 2 are writing,
	// and its token is below theirs.
	refused := func() []event {
		e := wr(0, 0, "k", 1, 10, 23, 24, false)
		e.Full = []int64{2, 3}
		return []event{
			acqM(0, 0, modePermit, "k", 1, 0, 1), e, rel(0, 0, "k", 1, 40, 41, true),
			acqM(1, 0, modePermit, "k", 2, 4, 5), wr(1, 0, "k", 2, 20, 6, 7, true), leave(1, 0, "k", 2, 52, 53), rel(1, 0, "k", 2, 54, 55, false),
			acqM(2, 0, modePermit, "k", 3, 10, 20), wr(2, 0, "k", 3, 30, 21, 22, true), leave(2, 0, "k", 3, 60, 61), rel(2, 0, "k", 3, 62, 63, false),
		}
	}
	wantClean(t, runFamCheck(Semaphore(2), append(refused(), lostAt(0, 0, "k", 1, 15)), nil))
	wantViolation(t, runFamCheck(Semaphore(2), refused(), nil), "none of which had lost its permit")
}

func TestSemCheckRegisterOverlap(t *testing.T) {
	// The register accepted 2's writes without cutting anyone off while 0
	// and 1 kept writing: three writers at once (0 told of its loss, so
	// the limit check is content).
	evs := []event{
		acqM(0, 0, modePermit, "k", 1, 0, 1), wr(0, 0, "k", 1, 10, 2, 3, true), wr(0, 0, "k", 1, 11, 30, 31, true), rel(0, 0, "k", 1, 40, 41, true),
		lostAt(0, 0, "k", 1, 15),
		acqM(1, 0, modePermit, "k", 2, 4, 5), wr(1, 0, "k", 2, 20, 6, 7, true), wr(1, 0, "k", 2, 21, 32, 33, true), leave(1, 0, "k", 2, 52, 53), rel(1, 0, "k", 2, 54, 55, false),
		acqM(2, 0, modePermit, "k", 3, 10, 20), wr(2, 0, "k", 3, 30, 21, 22, true), wr(2, 0, "k", 3, 31, 34, 35, true), leave(2, 0, "k", 3, 60, 61), rel(2, 0, "k", 3, 62, 63, false),
	}
	r := runFamCheck(Semaphore(2), evs, nil)
	wantViolation(t, r, "accepted writes of 3 writers at once")
	wantViolation(t, r, "not linearizable")
}

func TestSemCheckCutOffReadmitted(t *testing.T) {
	// 0, cut off at 22, writes again at 30 and is accepted.
	evs := append(semEvict(), lostAt(0, 0, "k", 1, 15), wr(0, 0, "k", 1, 11, 30, 31, true))
	r := runFamCheck(Semaphore(2), evs, nil)
	wantViolation(t, r, "after it had cut that writer off")
	wantViolation(t, r, "not linearizable")
	// Refused, as it should be: clean.
	evs[len(evs)-1] = func() event { e := wr(0, 0, "k", 1, 11, 30, 31, false); e.Floor = 1; return e }()
	wantClean(t, runFamCheck(Semaphore(2), evs, nil))
}

// rwHolds: writer 0 (token 1) writes; readers 1 and 2 (tokens 2, 3) read
// together; writer 3 (token 4) writes after them.
func rwHolds() []event {
	return []event{
		acqM(0, 0, modeWrite, "k", 1, 0, 1), wr(0, 0, "k", 1, 10, 2, 3, true), rdTok(0, 0, "k", 1, 1, 10, 4, 5, true), rel(0, 0, "k", 1, 6, 7, false),
		acqM(1, 0, modeRead, "k", 2, 5, 8), rdTok(1, 0, "k", 2, 1, 10, 9, 10, true), rdTok(1, 0, "k", 2, 1, 10, 20, 21, true), rel(1, 0, "k", 2, 30, 31, false),
		acqM(2, 0, modeRead, "k", 3, 6, 9), rdTok(2, 0, "k", 3, 1, 10, 11, 12, true), rel(2, 0, "k", 3, 25, 26, false),
		acqM(3, 0, modeWrite, "k", 4, 10, 32), wr(3, 0, "k", 4, 40, 33, 34, true), rdTok(3, 0, "k", 4, 4, 40, 35, 36, true), rel(3, 0, "k", 4, 37, 38, false),
	}
}

func TestRWCheckClean(t *testing.T) { wantClean(t, runFamCheck(ReadWrite(), rwHolds(), nil)) }

func TestRWCheckTokens(t *testing.T) {
	// The second writer's token is below the readers' acquired before it.
	evs := rwHolds()
	for i := 11; i <= 14; i++ {
		evs[i].Tok = 0
	}
	evs[13].Fence = 0
	wantViolation(t, runFamCheck(ReadWrite(), evs, nil), "not above the token")
}

func TestRWCheckLimit(t *testing.T) {
	// Writer 3 acquired while reader 1 still holds.
	evs := rwHolds()
	evs[11] = acqM(3, 0, modeWrite, "k", 4, 10, 28)
	wantViolation(t, runFamCheck(ReadWrite(), evs, nil), "a writer beside other holders")
	// Reader 1 had been told of its loss: fine.
	wantClean(t, runFamCheck(ReadWrite(), append(evs, lostAt(1, 0, "k", 2, 27)), nil))
	// Two writers at once.
	evs = rwHolds()
	evs[4] = acqM(1, 0, modeWrite, "k", 2, 5, 6)
	wantViolation(t, runFamCheck(ReadWrite(), evs, nil), "a writer beside other holders")
}

func TestRWCheckStaleWrite(t *testing.T) {
	// Writer 0 (token 1) writes again after reader 1 (token 2) read: the
	// register accepted a stale write.
	evs := append(rwHolds(), wr(0, 0, "k", 1, 11, 13, 14, true))
	r := runFamCheck(ReadWrite(), evs, nil)
	wantViolation(t, r, "a stale write got through")
	wantViolation(t, r, "not linearizable")
}

func TestRWCheckStaleRead(t *testing.T) {
	// Reader 1 (token 2) reads after writer 3 (token 4) wrote, and is
	// served.
	evs := rwHolds()
	evs[6] = rdTok(1, 0, "k", 2, 1, 10, 40, 41, true)
	evs[7] = rel(1, 0, "k", 2, 42, 43, false)
	wantViolation(t, runFamCheck(ReadWrite(), evs, nil), "a stale read got through")
	// ... and sees the newer writer's value.
	evs[6] = rdTok(1, 0, "k", 2, 4, 40, 40, 41, true)
	wantViolation(t, runFamCheck(ReadWrite(), evs, nil), "a writer granted after it")
	// A reader whose two reads differ.
	evs = rwHolds()
	evs[6] = rdTok(1, 0, "k", 2, 0, 0, 20, 21, true)
	wantViolation(t, runFamCheck(ReadWrite(), evs, nil), "a write got in while it held the lock")
}

func TestRWCheckRefusedMustBeReported(t *testing.T) {
	// Reader 1's late read is refused (writer 3 wrote): it had lost its
	// lock, and must have said so.
	evs := rwHolds()
	evs[6] = rdTok(1, 0, "k", 2, 0, 0, 40, 41, false)
	evs[7] = rel(1, 0, "k", 2, 42, 43, false)
	wantViolation(t, runFamCheck(ReadWrite(), evs, nil), "never reported it")
	evs[7] = rel(1, 0, "k", 2, 42, 43, true) // told at Release
	r := runFamCheck(ReadWrite(), evs, nil)
	if hasViolation(r, "never reported it") {
		t.Errorf("a refused reader that reported its loss was blamed: %q", r.Violations)
	}
	if r.StaleReads != 1 || r.Reads != 4 {
		t.Errorf("Reads, StaleReads = %d, %d; want 4, 1", r.Reads, r.StaleReads)
	}
}

func TestParseFamily(t *testing.T) {
	for _, f := range []Family{{}, Semaphore(1), Semaphore(16), ReadWrite()} {
		g, err := parseFamily(f.String())
		if err != nil || g != f {
			t.Errorf("parseFamily(%q) = %v, %v; want %v", f.String(), g, err, f)
		}
	}
	for _, s := range []string{"semaphore(0)", "semaphore(17)", "semaphore(x)", "rw"} {
		if _, err := parseFamily(s); err == nil {
			t.Errorf("parseFamily(%q) took it", s)
		}
	}
}
