package chaos

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// history is what the checks look at.
type history struct {
	family      Family
	events      []event
	freezes     map[int][][2]int64 // by worker: when its process was stopped
	faults      []faultRec
	ttl         time.Duration
	keys        []string
	settleStart int64 // the last fault had ended
	settle      time.Duration
}

// observeSlack is how much later than another worker's acquisition a loss
// may be observed and still count as reported before it. The two instants
// are taken by different goroutines (or processes) after the fact (when
// Done's watcher and the Acquire's caller run), and the scheduler may delay
// either; a backend that reports the loss after the other's grant by less
// than this passes. Network backends report a loss a drift margin (about a
// tenth of the TTL or more) before the server can grant again.
const observeSlack = 100 * time.Millisecond

// holdRec is one successful acquisition and what followed it.
type holdRec struct {
	acq     event
	lostAt  int64 // when its Done closed with an error; 0: never
	relInv  int64 // 0: never released
	relLost bool  // Release returned an error wrapping ErrLost
	rel     *event
	stale   int // its writes the register rejected
	staleRd int // reader-writer: its reads the register refused
}

func (h *holdRec) end() int64 {
	if h.relInv == 0 {
		return 1<<63 - 1
	}
	return h.relInv
}

func (h *holdRec) reported() bool { return h.lostAt != 0 || h.relLost }

// reportedBy reports whether h reported its loss by at, give or take
// observeSlack.
func reportedBy(h *holdRec, at int64) bool {
	return h.lostAt != 0 && h.lostAt <= at+int64(observeSlack)
}

// lossDesc says how a hold that another took over reported the loss.
func lossDesc(h *holdRec) string {
	switch {
	case h.lostAt != 0:
		return "reported the loss only at " + stamp(h.lostAt)
	case h.relLost:
		return "reported the loss only when it released"
	}
	return "never reported the loss"
}

func (h *holdRec) String() string {
	if h.acq.Mode != "" {
		return fmt.Sprintf("worker %d's %s hold #%d (token %d, acquired at %s)", h.acq.W, h.acq.Mode, h.acq.Seq, h.acq.Tok, stamp(h.acq.Done))
	}
	return fmt.Sprintf("worker %d's hold #%d (token %d, acquired at %s)", h.acq.W, h.acq.Seq, h.acq.Tok, stamp(h.acq.Done))
}

func stamp(ns int64) string { return time.Unix(0, ns).UTC().Format("15:04:05.000000") }

// check fills r's counts and violations from the history:
//   - fencing tokens are unique per key and grow with real time: a hold
//     acquired after another's acquisition completed has the larger token;
//   - exclusion: while a hold is in use (from its Acquire's return to its
//     Release call), no other worker acquires its key, unless the hold had
//     reported the loss by then (give or take observeSlack), or its process
//     was stopped (SIGSTOP)
//     within a TTL before the other's acquisition: a frozen process cannot
//     hear anything, and that is what fencing is for. Two acquisitions whose
//     returns were recorded in the other order than their tokens (a caller
//     the scheduler delayed) are ordered by the tokens;
//   - a hold whose lock was taken over, or whose writes the register
//     rejected, reported the loss (Done closed with ErrLost, or Release
//     returned it);
//   - the register accepted no write with a token below one it had accepted
//     before, and its history is linearizable (porcupine);
//   - every key asked for after the last fault ended was acquired then.
//
// The families' checks are in check_families.go.
func check(r *Report, h history) {
	byKey := collect(r, h)
	violate := func(format string, args ...any) {
		r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
	}
	if h.family.kind != mutexFamily {
		checkFamily(r, h, byKey, violate)
	} else {
		for key, hs := range byKey {
			checkTokens(key, hs, violate)
			checkExclusion(h, key, hs, violate)
		}
		// The register: no accepted write went below an accepted write
		// before it.
		checkRegister(r, h, violate)
	}

	// Liveness: every key that a worker asked for once the faults had
	// ended (an Acquire that ended, one way or the other, in the
	// fault-free time) was taken again then. Workers pick keys at random,
	// so a key nobody asked for then says nothing.
	for _, key := range h.keys {
		asked := slices.ContainsFunc(h.events, func(e event) bool {
			return e.Op == opAcquire && e.Key == key && e.Done >= h.settleStart
		})
		if asked && !slices.ContainsFunc(byKey[key], func(hr *holdRec) bool { return hr.acq.Done >= h.settleStart }) {
			violate("key %q: not acquired again in the %v after the last fault ended, though asked for", key, h.settle)
		}
	}
}

// collect counts the history's events into r, lists its holds in r.Holds,
// and returns the successful acquisitions by key.
func collect(r *Report, h history) map[string][]*holdRec {
	type hk struct{ w, seq int }
	holds := map[hk]*holdRec{}
	byKey := map[string][]*holdRec{}
	for _, e := range h.events {
		switch e.Op {
		case opAcquire:
			if !e.OK {
				r.AcquireFailed++
				kind, msg, _ := strings.Cut(e.Err, ": ")
				if r.AcquireErrors == nil {
					r.AcquireErrors = map[string]int{}
				}
				r.AcquireErrors[kind]++
				if kind == errBackend && len(r.ErrorSamples) < 5 && !slices.Contains(r.ErrorSamples, msg) {
					r.ErrorSamples = append(r.ErrorSamples, msg)
				}
				continue
			}
			r.Acquired++
			hr := &holdRec{acq: e}
			holds[hk{e.W, e.Seq}] = hr
			byKey[e.Key] = append(byKey[e.Key], hr)
		}
	}
	for _, e := range h.events {
		hr := holds[hk{e.W, e.Seq}]
		if hr == nil {
			continue
		}
		switch e.Op {
		case opLost:
			hr.lostAt = e.Done
			r.LossReported++
		case opRelease:
			hr.relInv, hr.relLost, hr.rel = e.Inv, e.Lost, &e
			if e.Stuck {
				r.Violations = append(r.Violations, fmt.Sprintf("key %q: %v: Done was still open 10s after Release returned (%s)", e.Key, hr, e.Err))
			}
		case opWrite:
			switch {
			case e.Err != "":
				r.WriteErrors++
			case e.OK:
				r.Writes++
			default:
				r.StaleRejected++
				hr.stale++
			}
			if e.Evicted != 0 && e.Err == "" {
				r.Evicted++
			}
		case opRead:
			if h.family.kind != rwFamily || e.Err != "" {
				break
			}
			if e.OK {
				r.Reads++
			} else {
				r.StaleReads++
				hr.staleRd++
			}
		}
	}
	for _, hr := range holds {
		if hr.relLost && hr.lostAt == 0 {
			r.LossReported++ // told at Release only
		}
	}
	r.Holds = make([]Hold, 0, len(holds))
	for _, hs := range byKey {
		for _, hr := range hs {
			hd := Hold{Worker: hr.acq.W, Key: hr.acq.Key, Mode: hr.acq.Mode, Token: hr.acq.Tok, Invoked: time.Unix(0, hr.acq.Inv), Acquired: time.Unix(0, hr.acq.Done)}
			if hr.lostAt != 0 {
				hd.Lost = time.Unix(0, hr.lostAt)
			}
			if hr.rel != nil {
				hd.Released, hd.ReleaseErr = time.Unix(0, hr.rel.Inv), hr.rel.Err
			}
			r.Holds = append(r.Holds, hd)
		}
	}
	slices.SortFunc(r.Holds, func(a, b Hold) int { return a.Acquired.Compare(b.Acquired) })
	return byKey
}

// frozenNear: hold a's process was stopped at some time within a TTL
// before at, and during the hold (not before it began).
func (h history) frozenNear(a *holdRec, at int64) bool {
	for _, f := range h.freezes[a.acq.W] {
		if f[0] <= at && f[1] >= max(at-int64(h.ttl), a.acq.Inv) {
			return true
		}
	}
	return false
}

// frozenDuring: w's process was stopped at some time in [from, to].
func (h history) frozenDuring(w int, from, to int64) bool {
	for _, f := range h.freezes[w] {
		if f[0] <= to && f[1] >= from {
			return true
		}
	}
	return false
}

// checkTokens: the tokens of key's holds are unique, and ordered as the
// acquisitions were in real time.
func checkTokens(key string, hs []*holdRec, violate func(format string, args ...any)) {
	seen := map[int64]*holdRec{}
	for _, a := range hs {
		if b := seen[a.acq.Tok]; b != nil {
			violate("key %q: token %d was given twice: to %v and to %v", key, a.acq.Tok, b, a)
		}
		seen[a.acq.Tok] = a
	}
	byInv := slices.SortedFunc(slices.Values(hs), func(a, b *holdRec) int { return cmp.Compare(a.acq.Inv, b.acq.Inv) })
	byDone := slices.SortedFunc(slices.Values(hs), func(a, b *holdRec) int { return cmp.Compare(a.acq.Done, b.acq.Done) })
	var maxDone *holdRec
	j := 0
	for _, b := range byInv {
		for ; j < len(byDone) && byDone[j].acq.Done < b.acq.Inv; j++ {
			if maxDone == nil || byDone[j].acq.Tok > maxDone.acq.Tok {
				maxDone = byDone[j]
			}
		}
		if maxDone != nil && b.acq.Tok <= maxDone.acq.Tok {
			violate("key %q: %v has token %d, not above the token %d of %v, acquired before it was asked for", key, b, b.acq.Tok, maxDone.acq.Tok, maxDone)
		}
	}
}

// checkExclusion: no two holds of key overlapped unless the earlier one
// reported its loss (or its process was frozen) by the later's grant, and a
// hold that lost its lock said so.
func checkExclusion(h history, key string, hs []*holdRec, violate func(format string, args ...any)) {
	byDone := slices.SortedFunc(slices.Values(hs), func(a, b *holdRec) int { return cmp.Compare(a.acq.Done, b.acq.Done) })
	for i, a := range byDone {
		takenOver, reported := false, false
		for _, b := range byDone[i+1:] {
			if b.acq.Done >= a.end() {
				break
			}
			if b.acq.W == a.acq.W {
				continue // a worker holds one lock at a time: cannot overlap itself
			}
			if h.frozenDuring(b.acq.W, b.acq.Inv, b.acq.Done) {
				// b's process was stopped during its Acquire: it may
				// have been granted before a and recorded the return
				// only when it went on, so the two cannot be ordered.
				continue
			}
			if b.acq.Tok < a.acq.Tok {
				// b was granted before a (tokens follow the grants),
				// and the return of its Acquire was recorded after a's
				// (the scheduler delayed its caller): a took the lock
				// over from b, which must have reported the loss by
				// a's acquisition.
				if !reportedBy(b, a.acq.Done) && !h.frozenNear(b, a.acq.Done) {
					violate("key %q: two holders: %v was acquired while %v, granted before it and returned after it, was in use and not frozen; the earlier %s", key, a, b, lossDesc(b))
				}
				continue
			}
			takenOver = true
			switch {
			case reportedBy(a, b.acq.Done):
			case h.frozenNear(a, b.acq.Done):
			case reported:
				// One violation per hold: a hold that never ended
				// (its worker hung) would otherwise flood the report.
			default:
				reported = true
				violate("key %q: two holders: %v was acquired while %v was in use (it released at %s) and not frozen; the earlier %s", key, b, a, relStamp(a), lossDesc(a))
			}
		}
		if (takenOver || a.stale > 0) && !a.reported() && a.relInv != 0 {
			why := "its lock was taken over"
			if a.stale > 0 {
				why = fmt.Sprintf("the register rejected %d of its writes (a newer token had written)", a.stale)
			}
			violate("key %q: %v lost its lock (%s) and never reported it: Done did not close with ErrLost and Release returned %v", key, a, why, relErr(a))
		}
	}
}

func relStamp(h *holdRec) string {
	if h.relInv == 0 {
		return "never"
	}
	return stamp(h.relInv)
}

func relErr(h *holdRec) string {
	if h.rel == nil {
		return "nothing (never called)"
	}
	if h.rel.Err == "" {
		return "nil"
	}
	return fmt.Sprintf("%q", h.rel.Err)
}

// Porcupine model of the register, partitioned by key.
type regInput struct {
	write      bool
	tok, value int64
}

type regOutput struct {
	ok           bool // a write was accepted; a read succeeded
	unknown      bool // the operation failed: it may or may not have happened
	fence, value int64
}

type regState struct{ fence, value int64 }

var registerModel = porcupine.NondeterministicModel{
	Partition: func(ops []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range ops {
			k := op.Metadata.(string)
			if by[k] == nil {
				keys = append(keys, k)
			}
			by[k] = append(by[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() []any { return []any{regState{}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(regState), input.(regInput), output.(regOutput)
		if !in.write {
			if out.unknown || s.fence == out.fence && s.value == out.value {
				return []any{s}
			}
			return nil
		}
		applies := in.tok >= s.fence
		next := regState{in.tok, in.value}
		switch {
		case out.unknown && applies:
			return []any{s, next}
		case out.unknown:
			return []any{s}
		case out.ok && applies:
			return []any{next}
		case !out.ok && !applies:
			return []any{s}
		}
		return nil
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(regInput), output.(regOutput)
		if !in.write {
			if out.unknown {
				return "read() -> failed"
			}
			return fmt.Sprintf("read() -> fence %d, value %x", out.fence, out.value)
		}
		verdict := "accepted"
		switch {
		case out.unknown:
			verdict = "failed"
		case !out.ok:
			verdict = "rejected"
		}
		return fmt.Sprintf("write(token %d, value %x) -> %s", in.tok, in.value, verdict)
	},
	DescribeState: func(state any) string {
		s := state.(regState)
		return fmt.Sprintf("fence %d, value %x", s.fence, s.value)
	},
}

// registerOps turns the history's register operations into porcupine's.
func registerOps(events []event) []porcupine.Operation {
	var ops []porcupine.Operation
	for _, e := range events {
		if e.Op != opWrite && e.Op != opRead {
			continue
		}
		op := porcupine.Operation{ClientId: e.W, Call: e.Inv, Return: e.Done, Metadata: e.Key}
		if e.Op == opWrite {
			op.Input = regInput{write: true, tok: e.Tok, value: e.Val}
		} else {
			op.Input = regInput{}
		}
		op.Output = regOutput{ok: e.OK, unknown: e.Err != "", fence: e.Fence, value: e.Val}
		if e.Op == opWrite {
			op.Output = regOutput{ok: e.OK, unknown: e.Err != ""}
		}
		ops = append(ops, op)
	}
	return ops
}

func checkRegister(r *Report, h history, violate func(string, ...any)) {
	byKey := map[string][]event{}
	for _, e := range h.events {
		if e.Op == opWrite && e.OK && e.Err == "" {
			byKey[e.Key] = append(byKey[e.Key], e)
		}
	}
	for key, ws := range byKey {
		slices.SortFunc(ws, func(a, b event) int { return cmp.Compare(a.Done, b.Done) })
		var top *event
		for i := range ws {
			w := &ws[i]
			if top != nil && w.Inv > top.Done && w.Tok < top.Tok {
				violate("key %q: the register accepted worker %d's write with token %d after it had accepted token %d (worker %d): a stale write got through", key, w.W, w.Tok, top.Tok, top.W)
			}
			if top == nil || w.Tok > top.Tok {
				top = w
			}
		}
	}
	res := porcupine.CheckOperationsTimeout(registerModel.ToModel(), registerOps(h.events), time.Minute)
	r.Linearizable = res == porcupine.Ok
	switch res {
	case porcupine.Illegal:
		violate("the register's history is not linearizable (see the visualisation written beside the test's artifacts)")
	case porcupine.Unknown:
		// Not a violation: the checker ran out of time. Reported as
		// Linearizable=false in the report.
	}
}
