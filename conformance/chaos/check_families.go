package chaos

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// The checks of the semaphore and reader-writer runs. They are the mutex's
// (check.go), with the limit of one holder replaced by the family's:
//   - tokens are unique per key and grow with real time, across permits,
//     readers and writers (checkTokens, as for the mutex): a writer's token
//     is above every token acquired before it;
//   - the limit (checkLimit): at no acquisition are more holds of the key
//     in use than the family admits (n permits; one writer and nobody else,
//     or readers only), not counting the holds that had reported their loss
//     by then (give or take observeSlack) or whose process was stopped
//     within a TTL before; and when only the stopped ones make the count
//     too high, one of them must report the loss at some time (by Done or
//     by Release);
//   - the family's register (checkSemRegister, checkRWRegister): what it
//     promises, its linearizability (porcupine), and that what it refused
//     is explained by a lost lock.

// maxFlagged is how many limit violations of one key are listed; the rest
// are counted in one more line (a holder that never ended would flood the
// report otherwise).
const maxFlagged = 10

func checkFamily(r *Report, h history, byKey map[string][]*holdRec, violate func(string, ...any)) {
	for key, hs := range byKey {
		checkTokens(key, hs, violate)
		checkLimit(h, key, hs, violate)
	}
	switch h.family.kind {
	case semaphoreFamily:
		checkSemRegister(r, h, byKey, violate)
	case rwFamily:
		checkRWRegister(r, h, byKey, violate)
	}
}

// admits reports whether holds may hold a key together in the family.
func (f Family) admits(holds []*holdRec) bool {
	if f.kind != rwFamily {
		return len(holds) <= f.limit()
	}
	for _, a := range holds {
		if a.acq.Mode != modeRead && len(holds) > 1 {
			return false
		}
	}
	return true
}

func (f Family) limitDesc() string {
	switch f.kind {
	case semaphoreFamily:
		return fmt.Sprintf("more holders than a semaphore of %d admits", f.n)
	case rwFamily:
		return "a writer beside other holders"
	}
	return "two holders"
}

func holdList(hs []*holdRec) string {
	s := make([]string, len(hs))
	for i, a := range hs {
		s[i] = a.String()
	}
	return strings.Join(s, "; ")
}

// checkLimit: at each acquisition of key, the holds in use (from their
// Acquire's return to their Release call) that had not reported a loss are
// no more than the family admits, frozen ones aside; when the frozen ones
// make too many, one of them reports the loss at some time.
//
// Why this never blames a correct backend: a hold's recorded use lies
// within the time it was granted and not yet released, so at the instant T
// of an acquisition the holds in use that still held their lock are at most
// what the family admits; any other was dropped before T, and a correct
// backend reports a drop no later than the moment another could acquire,
// so by T, unless the holder's process was stopped and could hear nothing.
func checkLimit(h history, key string, hs []*holdRec, violate func(string, ...any)) {
	byDone := slices.SortedFunc(slices.Values(hs), func(a, b *holdRec) int { return cmp.Compare(a.acq.Done, b.acq.Done) })
	var active []*holdRec
	flagged, more := 0, 0
	flag := func(format string, args ...any) {
		if flagged == maxFlagged {
			more++
			return
		}
		flagged++
		violate(format, args...)
	}
	for _, b := range byDone {
		at := b.acq.Done
		active = slices.DeleteFunc(active, func(a *holdRec) bool { return a.end() <= at })
		active = append(active, b)
		var live, frozen []*holdRec
		for _, a := range active {
			switch {
			case reportedBy(a, at):
			case h.frozenNear(a, at):
				frozen = append(frozen, a)
			default:
				live = append(live, a)
			}
		}
		if !h.family.admits(live) {
			flag("key %q: %s at %s, when %v was acquired: in use, not frozen and not told of a loss: %s", key, h.family.limitDesc(), stamp(at), b, holdList(live))
			continue
		}
		if !h.family.admits(append(live, frozen...)) && !slices.ContainsFunc(frozen, (*holdRec).reported) {
			flag("key %q: %s at %s, when %v was acquired, counting the frozen holds, and none of the frozen ones (%s) ever reported a loss: one of them lost its lock and never reported it", key, h.family.limitDesc(), stamp(at), b, holdList(frozen))
		}
	}
	if more > 0 {
		violate("key %q: %d more times %s (not listed)", key, more, h.family.limitDesc())
	}
}

// byToken maps key's holds by token.
func byToken(hs []*holdRec) map[int64]*holdRec {
	m := make(map[int64]*holdRec, len(hs))
	for _, a := range hs {
		m[a.acq.Tok] = a
	}
	return m
}

// checkSemRegister checks the semaphore's register (see register.semWrite):
//   - whenever it found n+1 writers at once (it cut one off), one of them
//     had lost its permit by then: told (Done), or frozen. Else the
//     semaphore let n+1 hold at once, which the register saw;
//   - it never accepted writes of more than n writers at once: a token
//     writes from its first accepted write to its last, and no more than n
//     such spans overlap;
//   - it never accepted a write of a writer after it had cut that writer
//     off;
//   - its history is linearizable (porcupine).
func checkSemRegister(r *Report, h history, byKey map[string][]*holdRec, violate func(string, ...any)) {
	n := h.family.n
	type span struct{ from, to int64 }
	spans := map[string]map[int64]*span{}
	cut := map[string]map[int64]int64{} // key, token: when it was cut off
	for _, e := range h.events {
		if e.Op != opWrite || e.Err != "" {
			continue
		}
		if e.Full != nil {
			tokens := append(slices.Clone(e.Full), e.Tok)
			holds := byToken(byKey[e.Key])
			var claim []*holdRec
			explained := false
			for _, t := range tokens {
				a := holds[t]
				if a == nil {
					continue
				}
				claim = append(claim, a)
				// A claimant that had released its permit was still
				// counted only because its leave failed.
				if reportedBy(a, e.Done) || h.frozenNear(a, e.Done) || a.relInv != 0 && a.relInv < e.Done {
					explained = true
				}
			}
			if !explained {
				violate("key %q: the register found %d writers at once at %s (%s), none of which had lost its permit (told, or frozen): the semaphore of %d let %d hold", e.Key, len(tokens), stamp(e.Done), holdList(claim), n, len(tokens))
			}
			if cut[e.Key] == nil {
				cut[e.Key] = map[int64]int64{}
			}
			c := e.Tok
			if e.OK {
				c = e.Evicted
			}
			if _, ok := cut[e.Key][c]; !ok {
				cut[e.Key][c] = e.Done
			}
		}
		if !e.OK {
			continue
		}
		if spans[e.Key] == nil {
			spans[e.Key] = map[int64]*span{}
		}
		if sp := spans[e.Key][e.Tok]; sp == nil {
			spans[e.Key][e.Tok] = &span{e.Done, e.Inv}
		} else {
			sp.from, sp.to = min(sp.from, e.Done), max(sp.to, e.Inv)
		}
	}
	for key, m := range spans {
		type edge struct {
			at  int64
			d   int
			tok int64
		}
		var edges []edge
		for tok, sp := range m {
			if sp.from < sp.to {
				edges = append(edges, edge{sp.from, 1, tok}, edge{sp.to, -1, tok})
			}
		}
		slices.SortFunc(edges, func(a, b edge) int {
			if c := cmp.Compare(a.at, b.at); c != 0 {
				return c
			}
			return cmp.Compare(a.d, b.d) // an end before a start at the same instant
		})
		in := map[int64]bool{}
		for _, ed := range edges {
			if ed.d < 0 {
				delete(in, ed.tok)
				continue
			}
			in[ed.tok] = true
			if len(in) > n {
				toks := slices.Sorted(func(yield func(int64) bool) {
					for t := range in {
						if !yield(t) {
							return
						}
					}
				})
				violate("key %q: the register accepted writes of %d writers at once at %s (tokens %v), more than the semaphore's %d", key, len(in), stamp(ed.at), toks, n)
				break
			}
		}
	}
	for _, e := range h.events {
		if e.Op == opWrite && e.OK && e.Err == "" {
			if at, ok := cut[e.Key][e.Tok]; ok && e.Inv > at {
				violate("key %q: the register accepted worker %d's write with token %d at %s after it had cut that writer off at %s", e.Key, e.W, e.Tok, stamp(e.Inv), stamp(at))
			}
		}
	}
	linearizable(r, semModel(n), semOps(h.events), violate)
}

// checkRWRegister checks the reader-writer register (see register.rwWrite
// and rwRead):
//   - no write was accepted after a write or a served read with a higher
//     token had completed (a stale writer got through);
//   - no read was served after a write with a higher token than the
//     reader's had been accepted, and none returned a value written by a
//     token above the reader's: a reader never sees what a writer granted
//     after it wrote, which it could only if it had lost its lock;
//   - the reads served to one reader hold all returned the same value: no
//     write got in while it read;
//   - a hold whose write or read the register refused reported the loss of
//     its lock (Done, or Release) or was frozen when it was taken: a
//     refusal means a holder with a newer token had used the register, and
//     tokens are granted in order, so the refused one had lost its lock;
//   - its history is linearizable (porcupine).
func checkRWRegister(r *Report, h history, byKey map[string][]*holdRec, violate func(string, ...any)) {
	ops := map[string][]event{}
	for _, e := range h.events {
		if (e.Op == opWrite || e.Op == opRead) && e.OK && e.Err == "" {
			ops[e.Key] = append(ops[e.Key], e)
		}
	}
	for key, es := range ops {
		byInv := slices.SortedFunc(slices.Values(es), func(a, b event) int { return cmp.Compare(a.Inv, b.Inv) })
		byDone := slices.SortedFunc(slices.Values(es), func(a, b event) int { return cmp.Compare(a.Done, b.Done) })
		var topAny, topWrite *event // the highest tokens completed before: any op, writes
		j := 0
		for i := range byInv {
			e := &byInv[i]
			for ; j < len(byDone) && byDone[j].Done < e.Inv; j++ {
				d := &byDone[j]
				if topAny == nil || d.Tok > topAny.Tok {
					topAny = d
				}
				if d.Op == opWrite && (topWrite == nil || d.Tok > topWrite.Tok) {
					topWrite = d
				}
			}
			switch e.Op {
			case opWrite:
				if topAny != nil && topAny.Tok > e.Tok {
					violate("key %q: the register accepted worker %d's write with token %d after a %s with token %d (worker %d) had completed: a stale write got through", key, e.W, e.Tok, topAny.Op, topAny.Tok, topAny.W)
				}
			case opRead:
				if e.Fence > e.Tok {
					violate("key %q: worker %d's read with token %d returned a value written by token %d, a writer granted after it", key, e.W, e.Tok, e.Fence)
				} else if topWrite != nil && topWrite.Tok > e.Tok {
					violate("key %q: the register served worker %d's read with token %d after it had accepted a write with token %d (worker %d): a stale read got through", key, e.W, e.Tok, topWrite.Tok, topWrite.W)
				}
			}
		}
	}
	type hk struct{ w, seq int }
	seen := map[hk]event{}
	for _, e := range h.events {
		if e.Op != opRead || !e.OK || e.Err != "" {
			continue
		}
		k := hk{e.W, e.Seq}
		if first, ok := seen[k]; !ok {
			seen[k] = e
		} else if first.Fence != e.Fence || first.Val != e.Val {
			violate("key %q: worker %d's hold #%d (token %d) read token %d's value %x, then token %d's value %x: a write got in while it held the lock", e.Key, e.W, e.Seq, e.Tok, first.Fence, first.Val, e.Fence, e.Val)
		}
	}
	for key, hs := range byKey {
		for _, a := range hs {
			if (a.stale > 0 || a.staleRd > 0) && !a.reported() && a.relInv != 0 {
				violate("key %q: %v lost its lock (the register refused %d of its writes and %d of its reads: a newer token had used it) and never reported it: Done did not close with ErrLost and Release returned %v", key, a, a.stale, a.staleRd, relErr(a))
			}
		}
	}
	linearizable(r, rwModel, rwOps(h.events), violate)
}

// linearizable runs porcupine on a register's history (see checkRegister).
func linearizable(r *Report, m porcupine.Model, ops []porcupine.Operation, violate func(string, ...any)) {
	res := porcupine.CheckOperationsTimeout(m, ops, time.Minute)
	r.Linearizable = res == porcupine.Ok
	if res == porcupine.Illegal {
		violate("the register's history is not linearizable (see the visualisation written beside the test's artifacts)")
	}
}

// partitionByKey is the models' partition: each key's register is a
// register of its own.
func partitionByKey(ops []porcupine.Operation) [][]porcupine.Operation {
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
}

// The semaphore register's model (see register.semWrite). Its state is
// comparable: the writers in ascending order, padded with zeros.
type semState struct {
	w     [maxSemaphore]int64
	k     int // writers
	floor int64
}

type semInput struct {
	leave bool
	tok   int64
}

type semOutput struct {
	ok, unknown bool
	evicted     int64
	full        [maxSemaphore]int64
	floor       int64
}

func (s semState) has(t int64) bool { return slices.Contains(s.w[:s.k], t) }

func (s semState) without(t int64) semState {
	out := semState{floor: s.floor}
	for _, x := range s.w[:s.k] {
		if x != t {
			out.w[out.k] = x
			out.k++
		}
	}
	return out
}

func (s semState) with(t int64) semState {
	ws := append(slices.Clone(s.w[:s.k]), t)
	slices.Sort(ws)
	out := semState{k: len(ws), floor: s.floor}
	copy(out.w[:], ws)
	return out
}

// semStep is what the register does with a write of token t: its answer
// and its next state.
func semStep(n int, s semState, t int64) (semOutput, semState) {
	switch {
	case s.has(t):
		return semOutput{ok: true}, s
	case t <= s.floor:
		return semOutput{floor: s.floor}, s
	case s.k < n:
		return semOutput{ok: true}, s.with(t)
	case t < s.w[0]:
		next := s
		next.floor = max(next.floor, t)
		return semOutput{full: s.w}, next
	}
	next := s.without(s.w[0]).with(t)
	next.floor = max(s.floor, s.w[0])
	return semOutput{ok: true, evicted: s.w[0], full: s.w}, next
}

func semModel(n int) porcupine.Model {
	m := porcupine.NondeterministicModel{
		Partition: partitionByKey,
		Init:      func() []any { return []any{semState{}} },
		Step: func(state, input, output any) []any {
			s, in, out := state.(semState), input.(semInput), output.(semOutput)
			if in.leave {
				next := s.without(in.tok)
				if out.unknown && next != s {
					return []any{s, next}
				}
				return []any{next}
			}
			want, next := semStep(n, s, in.tok)
			switch {
			case out.unknown && next != s:
				return []any{s, next}
			case out.unknown:
				return []any{s}
			case out.ok == want.ok && out.evicted == want.evicted && out.full == want.full && out.floor == want.floor:
				return []any{next}
			}
			return nil
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(semInput), output.(semOutput)
			if in.leave {
				return fmt.Sprintf("leave(token %d)", in.tok)
			}
			switch {
			case out.unknown:
				return fmt.Sprintf("write(token %d) -> failed", in.tok)
			case out.ok && out.evicted != 0:
				return fmt.Sprintf("write(token %d) -> accepted, cutting off %d", in.tok, out.evicted)
			case out.ok:
				return fmt.Sprintf("write(token %d) -> accepted", in.tok)
			case out.floor != 0:
				return fmt.Sprintf("write(token %d) -> refused (floor %d)", in.tok, out.floor)
			}
			return fmt.Sprintf("write(token %d) -> refused (%d writers above it)", in.tok, n)
		},
		DescribeState: func(state any) string {
			s := state.(semState)
			return fmt.Sprintf("writers %v, floor %d", s.w[:s.k], s.floor)
		},
	}
	return m.ToModel()
}

func semOps(events []event) []porcupine.Operation {
	var ops []porcupine.Operation
	for _, e := range events {
		op := porcupine.Operation{ClientId: e.W, Call: e.Inv, Return: e.Done, Metadata: e.Key}
		switch e.Op {
		case opWrite:
			out := semOutput{ok: e.OK, unknown: e.Err != "", evicted: e.Evicted, floor: e.Floor}
			copy(out.full[:], e.Full)
			op.Input, op.Output = semInput{tok: e.Tok}, out
		case opLeave:
			op.Input, op.Output = semInput{leave: true, tok: e.Tok}, semOutput{ok: e.OK, unknown: e.Err != ""}
		default:
			continue
		}
		ops = append(ops, op)
	}
	return ops
}

// The reader-writer register's model (see register.rwWrite and rwRead).
type rwState struct{ wfence, rfence, value int64 }

type rwInput struct {
	write      bool
	tok, value int64
}

// rwOutput is regOutput: ok is a write accepted or a read served.
type rwOutput = regOutput

var rwModel = (&porcupine.NondeterministicModel{
	Partition: partitionByKey,
	Init:      func() []any { return []any{rwState{}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(rwState), input.(rwInput), output.(rwOutput)
		var applies bool
		var next rwState
		if in.write {
			applies = in.tok >= s.wfence && in.tok >= s.rfence
			next = rwState{in.tok, s.rfence, in.value}
		} else {
			applies = in.tok >= s.wfence
			next = rwState{s.wfence, max(s.rfence, in.tok), s.value}
		}
		switch {
		case out.unknown && applies:
			return []any{s, next}
		case out.unknown:
			return []any{s}
		case !applies && !out.ok:
			return []any{s}
		case applies && out.ok && (in.write || out.fence == s.wfence && out.value == s.value):
			return []any{next}
		}
		return nil
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(rwInput), output.(rwOutput)
		verdict := "refused"
		switch {
		case out.unknown:
			verdict = "failed"
		case out.ok && in.write:
			verdict = "accepted"
		case out.ok:
			verdict = fmt.Sprintf("token %d's value %x", out.fence, out.value)
		}
		if in.write {
			return fmt.Sprintf("write(token %d, value %x) -> %s", in.tok, in.value, verdict)
		}
		return fmt.Sprintf("read(token %d) -> %s", in.tok, verdict)
	},
	DescribeState: func(state any) string {
		s := state.(rwState)
		return fmt.Sprintf("written by %d (value %x), read up to %d", s.wfence, s.value, s.rfence)
	},
}).ToModel()

func rwOps(events []event) []porcupine.Operation {
	var ops []porcupine.Operation
	for _, e := range events {
		if e.Op != opWrite && e.Op != opRead {
			continue
		}
		ops = append(ops, porcupine.Operation{
			ClientId: e.W, Call: e.Inv, Return: e.Done, Metadata: e.Key,
			Input:  rwInput{write: e.Op == opWrite, tok: e.Tok, value: e.Val},
			Output: rwOutput{ok: e.OK, unknown: e.Err != "", fence: e.Fence, value: e.Val},
		})
	}
	return ops
}

// registerModelOps is the model of the family's register and the history's
// operations on it, for the visualisation.
func registerModelOps(f Family, events []event) (porcupine.Model, []porcupine.Operation) {
	switch f.kind {
	case semaphoreFamily:
		return semModel(f.n), semOps(events)
	case rwFamily:
		return rwModel, rwOps(events)
	}
	return registerModel.ToModel(), registerOps(events)
}
