package redlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/backoff"
	"github.com/go-locker/locker/internal/lease"
)

// One Redlock round, and TryAcquire's rounds: the grant on every node, the
// tally, the fencing write-back, and the clean-up of a round that failed.

// maxSplitRounds bounds the rounds of a TryAcquire that keeps losing to
// contenders that split the nodes between them.
const maxSplitRounds = 8

// try is TryAcquire: one round, repeated after a jittered pause only while
// it lost to a split between contenders (nobody holds a majority, so
// nobody may get the key unless someone tries again: Redlock's
// contenders all back off after a split).
func (l *Locker) try(ctx context.Context, key string, k keys, tm timing) (*Handle, error) {
	pause := backoff.New(splitBackoff, splitBackoff<<4)
	prefer := -1
	for i := 0; ; i++ {
		h, r, err := l.round(ctx, key, k, tm, nil, prefer)
		prefer = r.prefer
		if h != nil || err != nil {
			return h, err
		}
		if !r.split() || i+1 >= maxSplitRounds {
			return nil, r.err()
		}
		// ctx is Life.Enter's: it ends when Close begins too.
		if !backoff.Sleep(ctx, pause.Next()) {
			return nil, l.life.Why(ctx, nil)
		}
	}
}

// roundResult is what a round that did not acquire found.
type roundResult struct {
	n, quorum       int
	granted, denied int
	failed          int
	firstErr        error // of a failed node, with its name
	held            bool  // one other owner holds the lock on a majority
	maxHolder       int   // the most nodes that one other owner holds it on
	holderLeft      time.Duration
	why             string // set when a majority granted but the round failed later

	// Semaphores: grants of other slots than the one most nodes granted
	// (given back), and the slot free on most nodes (-1: none known),
	// which the next round asks for.
	otherSlots int
	prefer     int

	// An Acquire's first round on a lock family: the nodes that queued
	// the waiter, the provisional ticket a majority of them gave (else the
	// largest: see agreed), and how many of them gave that one.
	queued      int
	ticket      int64
	ticketAgree int

	// A family's round whose claims of a token kept colliding with
	// other holders' (see claim): a retry after a pause may win.
	collided bool
}

// unreachable reports whether too few nodes answered for any round to
// reach a majority: waiting would not help.
func (r roundResult) unreachable() bool { return r.n-r.failed < r.quorum }

// split reports a round that lost only to other contenders' partial grants:
// nobody holds a majority, and a retry after a jittered pause may win. A
// round with nodes that failed is not a split when one other owner, with
// the nodes that did not answer, may hold a majority: retrying cannot win
// until the failed nodes answer again.
func (r roundResult) split() bool {
	if r.collided {
		return true
	}
	return !r.held && r.why == "" && (r.denied > 0 || r.otherSlots > 0) && r.n-r.failed >= r.quorum &&
		r.maxHolder+r.failed < r.quorum
}

// notAcquired reports whether other holders have the key on a majority:
// one holder, or contenders that split the nodes (after retries).
func (r roundResult) notAcquired() bool { return r.held || r.denied >= r.n-r.quorum+1 }

func (r roundResult) err() error {
	counts := fmt.Sprintf("%d of %d nodes granted, %d held by another client, %d failed or did not answer (need %d)",
		r.granted, r.n, r.denied, r.failed, r.quorum)
	if r.otherSlots > 0 {
		counts = fmt.Sprintf("%d of %d nodes granted one permit slot, %d another, %d were full or had waiters first, %d failed or did not answer (need %d)",
			r.granted, r.n, r.otherSlots, r.denied, r.failed, r.quorum)
	}
	switch {
	case r.held:
	case r.failed > 0 && r.n-r.failed < r.quorum:
		counts += "; too few nodes answered for a majority (unreachable or failing)"
	case r.failed > 0 && r.denied > 0:
		counts += "; no other client holds a majority of the nodes that answered, and the rest were unreachable or failing"
	case r.denied > 0 || r.otherSlots > 0:
		counts += "; contenders split the nodes, none holds a majority"
	}
	switch {
	case r.why != "":
		return fmt.Errorf("%w: %s (%s)", ErrNoQuorum, r.why, counts)
	case r.notAcquired() && r.failed == 0:
		return fmt.Errorf("%w: %s", locker.ErrNotAcquired, counts)
	case r.notAcquired():
		return fmt.Errorf("%w: %s; first failure: %v", locker.ErrNotAcquired, counts, r.firstErr)
	case r.firstErr != nil:
		return fmt.Errorf("%w: %s: %w", ErrNoQuorum, counts, r.firstErr)
	default:
		return fmt.Errorf("%w: %s", ErrNoQuorum, counts)
	}
}

// round makes one Redlock attempt with a fresh owner token: grant on every
// node in parallel (grant); if a majority granted (tally), take as the
// candidate token the value a majority of the nodes returned (agreed),
// else the largest, and write it back to the granting nodes that returned
// less (writeBack); success iff the write-back confirmed our lock on a
// majority and the validity left is at least the minimum. Otherwise the
// lock is deleted on every node that may hold it (granted, or did not
// answer) before round returns.
//
// The lock families' rounds are the same (k.kind says which scripts run;
// see families.go), with two differences: q, when not nil, is a waiter in
// the key's queue, which a node that grants takes out of it and a round
// that fails puts back (or takes out, when the round's error ends the
// wait); and a semaphore's nodes may grant different slots, of which the
// slot most of them granted counts (asking for prefer where it is free)
// and the others are given back.
func (l *Locker) round(ctx context.Context, key string, k keys, tm timing, q *queued, prefer int) (*Handle, roundResult, error) {
	if q != nil {
		// The round's requests read a copy: one that ends after the round
		// stopped waiting for it must not read what the wait changes.
		c := *q
		q = &c
	}
	owner := lease.NewOwner()
	if k.kind == mutexLock {
		owner = withDescription(owner, tm.desc)
	}
	r := roundResult{n: len(l.clients), quorum: l.quorum, prefer: -1}
	plan, err := l.vet.plan()
	if err != nil {
		return nil, r, err
	}
	sent := time.Now() // every node started its lease no earlier
	grants, counts, err := l.grant(ctx, k, owner, tm, plan, q, prefer)
	if err != nil {
		// Also a node that may evict, or two nodes that are one server.
		l.cleanup(ctx, k, owner, l.all, tm.nodeTimeout, false, q, queueDrop)
		return nil, r, err
	}
	if err := l.limitMismatch(grants); err != nil {
		l.cleanup(ctx, k, owner, mayHold(grants), tm.nodeTimeout, false, q, queueDrop)
		return nil, r, err
	}
	granted, others, candidate := l.tally(&r, grants, counts)
	if r.granted < l.quorum {
		return nil, r, l.cleanup(ctx, k, owner, mayHold(grants), tm.nodeTimeout, false, q, queueKeep)
	}
	if k.kind == mutexLock {
		vals := make([]int64, len(granted))
		for j, i := range granted {
			vals[j] = grants.v[i].token
		}
		if v, n := agreed(vals, l.quorum); n >= l.quorum {
			candidate = v
		}
		r.why, err = l.writeBack(ctx, k, owner, granted, grants, candidate, tm)
	} else {
		candidate, err = l.claim(ctx, &r, k, owner, granted, candidate, tm, sent)
	}
	if err != nil {
		l.cleanup(ctx, k, owner, l.all, tm.nodeTimeout, true, q, queueDrop)
		return nil, r, err
	}
	if left := time.Until(sent.Add(tm.ttl - tm.drift)); r.why == "" && left < tm.minValidity {
		r.why = fmt.Sprintf("only %v of the %v lease was left after %v of rounds and a drift allowance of %v (at least %v needed)",
			left.Round(time.Millisecond), tm.ttl, time.Since(sent).Round(time.Millisecond), tm.drift, tm.minValidity)
	}
	if r.why != "" {
		return nil, r, l.cleanup(ctx, k, owner, mayHold(grants), tm.nodeTimeout, true, q, queueKeep)
	}
	token, err := l.cfg.Token(candidate)
	if err != nil {
		// A counter beyond any value INCR and the write-back reach (written
		// by hand): refuse rather than hand out a wrapped-around token.
		return nil, r, errors.Join(err, l.cleanup(ctx, k, owner, mayHold(grants), tm.nodeTimeout, true, q, queueDrop))
	}
	if k.kind == permitLock {
		k.lock = permitKey(k, grants.v[granted[0]].slot)
	}
	h := newHandle(l, key, k, owner, token, tm, sent)
	if !l.register(h) {
		l.cleanup(context.Background(), k, owner, l.all, tm.nodeTimeout, true, q, queueDrop)
		return nil, r, locker.ErrClosed
	}
	h.start()
	if q != nil || len(others) > 0 {
		l.withdraw(k, owner, granted, q, tm)
	}
	return h, r, nil
}

// grant is a round's first step: the acquire request on every node in
// parallel, asking the nodes of plan to vet their servers in the same
// request (see vet.go), and the vetting of the answers. counts says which
// nodes' grants count. An error (the round's context or the Locker ended,
// or a node is unsafe: see vet.go) leaves the clean-up to the caller.
func (l *Locker) grant(ctx context.Context, k keys, owner string, tm timing, plan vetPlan, q *queued, prefer int) (outcome[grant], []bool, error) {
	// The requests read a copy: one that starts late (fanout has stopped
	// waiting for it) must not read plan.ask while confirm writes it.
	ask := slices.Clone(plan.ask)
	grants, err := fanoutSettle(l, ctx, ctx, l.closing, l.all, tm.nodeTimeout,
		func(ctx context.Context, i int, c goredis.UniversalClient) (grant, error) {
			if ask[i] {
				return runAcquireVetted(ctx, c, k, owner, tm.ttl, q, prefer, !l.cfg.AllowEviction, l.idKey())
			}
			return runAcquire(ctx, c, k, owner, tm.ttl, q, prefer)
		},
		func(i int, g grant, err error) {
			// A grant that came too late: nobody counts it. A late error
			// may be a request that ran on the node but whose reply was
			// lost, perhaps after the round's clean-up there: delete
			// again (owner-checked, so harmless if nothing is there).
			switch {
			case err == nil && g.ok:
				l.releaseOn(i, k, owner, MaxNodeTimeout)
			case err != nil && maySent(err):
				l.releaseOn(i, k, owner, tm.nodeTimeout)
			}
		},
		func(o outcome[grant]) bool { // a majority is out of reach
			denied := 0
			for i := range l.clients {
				if o.ok(i) && !o.v[i].ok {
					denied++
				}
			}
			return denied >= len(l.clients)-l.quorum+1
		}, true)
	if err != nil {
		return grants, nil, err
	}
	answers := make([]vetAnswer, len(l.clients))
	for i := range answers {
		answers[i].asked = plan.ask[i]
		if g := grants.v[i]; grants.answered[i] && g.vet != nil {
			answers[i].ok, answers[i].vet = true, *g.vet
		}
	}
	if !plan.full && l.vet.learns(answers) {
		if err := l.confirm(ctx, &plan, answers, tm); err != nil {
			return grants, nil, err
		}
	}
	counts, err := l.updateVet(plan, answers)
	return grants, counts, err
}

// tally counts the grants into r (granted, denied, failed, and the other
// holders seen) and returns the nodes that granted and count, and the
// candidate token: the largest counter among them. On a semaphore, granted
// are the nodes that granted the slot most of them granted (the lowest
// such slot on a tie); others are those that granted another slot.
func (l *Locker) tally(r *roundResult, grants outcome[grant], counts []bool) (granted, others []int, candidate int64) {
	byHolder := map[string][]time.Duration{}
	bySlot := map[int][]int{}
	freeOn := map[int]int{}
	var tickets []int64
	for i := range l.clients {
		switch {
		case !grants.ok(i):
			r.failed++
			if r.firstErr == nil {
				r.firstErr = fmt.Errorf("%s: %w", l.addrs[i], grants.err[i])
			}
		case grants.v[i].ok && !counts[i]:
			// Its server's identity is not yet compared with the others'
			// (see vet.go): it may be one of them under another name.
			r.failed++
			if r.firstErr == nil {
				r.firstErr = fmt.Errorf("%s: granted, but not counted: its server is not yet compared with the others' (it did not answer when they were asked together)", l.addrs[i])
			}
		case grants.v[i].ok:
			bySlot[grants.v[i].slot] = append(bySlot[grants.v[i].slot], i)
		default:
			r.denied++
			g := grants.v[i]
			if g.ticket > 0 {
				r.queued++
				tickets = append(tickets, g.ticket)
			}
			byHolder[g.holder] = append(byHolder[g.holder], g.pttl)
		}
	}
	r.ticket, r.ticketAgree = agreed(tickets, l.quorum)
	for i := range l.clients {
		if grants.ok(i) {
			for _, s := range grants.v[i].free {
				freeOn[s]++
			}
		}
	}
	best := -1
	for s, nodes := range bySlot {
		if best < 0 || len(nodes) > len(bySlot[best]) || len(nodes) == len(bySlot[best]) && s < best {
			best = s
		}
	}
	for s, nodes := range bySlot {
		if s == best {
			granted = nodes
		} else {
			others = append(others, nodes...)
		}
	}
	for _, i := range granted {
		candidate = max(candidate, grants.v[i].token)
	}
	r.granted, r.otherSlots = len(granted), len(others)
	for s, c := range freeOn {
		if r.prefer < 0 || c > freeOn[r.prefer] || c == freeOn[r.prefer] && s < r.prefer {
			r.prefer = s
		}
	}
	if r.otherSlots > 0 && r.granted < l.quorum && freeOn[r.prefer] < l.quorum {
		// The nodes granted different slots, and no slot is free on a
		// majority: every permit is held, as far as a majority can tell.
		r.held = true
	}
	// A node that refuses because waiters are queued ahead ("*") stands
	// with the holder the others name: the key is held, or about to be
	// taken by the waiter at the head, not split between contenders. (A
	// holder granted on a bare majority leaves the other node free, which
	// refuses for the queue: without this every waiter would take it for
	// a split and run rounds every few milliseconds.)
	star := len(byHolder["*"])
	for holder, pttls := range byHolder {
		n := len(pttls)
		if holder != "*" {
			n += star
		}
		r.maxHolder = max(r.maxHolder, n)
		if n >= l.quorum {
			r.held = true
			if holder != "*" {
				r.holderLeft = max(r.holderLeft, holderLeft(pttls, l.quorum))
			}
		}
	}
	return granted, others, candidate
}

// agreed returns the value that at least quorum of vals are, and how many
// are; when none is, the largest and how many are that (0, 0 for none).
// A round takes as its token (the mutex's) or its waiter's ticket the
// value a majority of the nodes returned, and only when they do not agree
// the largest: a majority's common value orders this round after every
// acquisition (or waiter's first round) confirmed before it, as the
// largest does (see "Fencing tokens" in doc.go), and needs no write-back.
// Values differ between nodes even when no node missed a grant: two rounds
// whose requests reach the nodes in different orders (a newcomer's first
// round beside the woken waiter's) take the counter's next values in
// different orders, one node giving each the other's value.
func agreed(vals []int64, quorum int) (v int64, n int) {
	for _, x := range vals {
		c := 0
		for _, y := range vals {
			if y == x {
				c++
			}
		}
		if c >= quorum {
			return x, c
		}
		if x > v {
			v, n = x, c
		}
	}
	return v, n
}

// mayHold returns the nodes where a round's lock may be: those that
// granted, failed or did not answer.
func mayHold(grants outcome[grant]) []int {
	var s []int
	for i := range grants.v {
		if !grants.answered[i] || grants.err[i] != nil || grants.v[i].ok {
			s = append(s, i)
		}
	}
	return s
}

// writeBack is a round's second step (see "Fencing tokens" in doc.go), on
// the granting nodes only: the argument needs the value each of them
// returned to come from the grant that started our lock there. A node
// whose grant returned the candidate itself has its work done: its
// counter held the candidate while our lock was there, which is all the
// write-back makes sure of. So the round writes back only to the nodes
// that returned less, and not at all when a majority returned the
// candidate (the nodes' counters agree: every round not preceded by a
// failure or an early expiry). It returns why the round failed when the
// candidate is confirmed with our lock on less than a majority ("" when
// it is).
func (l *Locker) writeBack(ctx context.Context, k keys, owner string, granted []int, grants outcome[grant], candidate int64, tm timing) (why string, err error) {
	settled := 0
	var behind []int
	for _, i := range granted {
		if grants.v[i].token == candidate {
			settled++
		} else {
			behind = append(behind, i)
		}
	}
	if settled >= l.quorum {
		return "", nil
	}
	wb, err := fanout(l, ctx, ctx, l.closing, behind, tm.nodeTimeout,
		func(ctx context.Context, _ int, c goredis.UniversalClient) (bool, error) {
			return runWriteback(ctx, c, k, owner, candidate)
		}, nil, nil)
	if err != nil {
		return "", err
	}
	confirmed, gone := settled, 0
	var wbErr error
	for _, i := range behind {
		switch {
		case wb.ok(i) && wb.v[i]:
			confirmed++
		case wb.ok(i):
			gone++
		case wbErr == nil:
			wbErr = fmt.Errorf("%s: %w", l.addrs[i], wb.err[i])
		}
	}
	if confirmed >= l.quorum {
		return "", nil
	}
	why = fmt.Sprintf("the fencing write-back confirmed the lock on only %d of %d granting nodes (%d no longer held it, %d failed or did not answer",
		confirmed, len(granted), gone, len(granted)-confirmed-gone)
	if wbErr != nil {
		why += ": " + wbErr.Error()
	}
	return why + ")", nil
}

// maxClaimRounds bounds the claims of a family's round (see claim).
const maxClaimRounds = 8

// claim is a family round's write-back (see "Fencing tokens" in doc.go):
// it claims candidate for owner on the granting nodes, and succeeds when a
// majority accepted it. A node refuses a token that another owner claimed
// there (two holders of a semaphore or two readers that hold at once may
// take the same largest value of a majority's counters), and answers a
// fresh value of its counter; when a majority may still accept, claim
// tries again with a token above the candidate and every value the
// refusing nodes answered, on the nodes that still hold the grant. Two
// owners cannot both have a token accepted by a majority: the majorities
// share a node, which accepted it once.
//
// It returns the token claimed, or sets r.why when the claims confirmed
// the lock on less than a majority (and r.collided when other owners'
// claims kept taking the tokens tried).
func (l *Locker) claim(ctx context.Context, r *roundResult, k keys, owner string, granted []int, candidate int64, tm timing, sent time.Time) (int64, error) {
	type answer struct {
		state   int
		counter int64
	}
	nodes := granted
	for attempt := 1; ; attempt++ {
		t := candidate
		res, err := fanout(l, ctx, ctx, l.closing, nodes, tm.nodeTimeout,
			func(ctx context.Context, _ int, c goredis.UniversalClient) (answer, error) {
				s, n, err := runClaim(ctx, c, k, owner, t)
				return answer{s, n}, err
			}, nil, nil)
		if err != nil {
			return 0, err
		}
		confirmed, gone, taken := 0, 0, 0
		next := candidate + 1
		var still []int // the nodes that may still accept
		var firstErr error
		for _, i := range nodes {
			switch {
			case !res.ok(i):
				still = append(still, i)
				if firstErr == nil {
					firstErr = fmt.Errorf("%s: %w", l.addrs[i], res.err[i])
				}
			case res.v[i].state == claimAccepted:
				confirmed++
				still = append(still, i)
			case res.v[i].state == claimTaken:
				taken++
				still = append(still, i)
				next = max(next, res.v[i].counter)
			default:
				gone++
			}
		}
		if confirmed >= l.quorum {
			return candidate, nil
		}
		left := time.Until(sent.Add(tm.ttl - tm.drift))
		if taken > 0 && len(still) >= l.quorum && attempt < maxClaimRounds && left >= tm.minValidity {
			candidate, nodes = next, still
			continue
		}
		r.why = fmt.Sprintf("the fencing write-back confirmed the lock on only %d of %d granting nodes (%d no longer held it, %d had given token %d to another holder, %d failed or did not answer",
			confirmed, len(nodes), gone, taken, candidate, len(nodes)-confirmed-gone-taken)
		if firstErr != nil {
			r.why += ": " + firstErr.Error()
		}
		r.why += ")"
		if taken > 0 && len(still) >= l.quorum {
			r.why += fmt.Sprintf(" after %d claims", attempt)
			r.collided = true
		}
		return 0, nil
	}
}

// holderLeft estimates when a holder seen on len(pttls) ≥ quorum nodes
// stops holding a majority: when the (len−quorum+1)-th shortest of its
// remaining leases there ends. Zero when that lease is unknown.
func holderLeft(pttls []time.Duration, quorum int) time.Duration {
	i := len(pttls) - quorum
	if i < 0 {
		return 0
	}
	slices.Sort(pttls)
	return max(pttls[i], 0)
}

// cleanup deletes our lock of this round on nodes, waiting for the nodes'
// answers as long as ctx and the node timeout allow; the requests
// themselves are not bound by ctx, so that a cancelled Acquire leaves
// nothing behind. It does not announce the deletion: a partial grant
// blocked nobody who could otherwise have had a majority, and waking every
// waiter for it would make them all contend again while the holder holds.
// It returns ctx's error if ctx ended, else nil.
// A round that had a majority and failed later (write-back, validity)
// announces it (announce), as a release would.
//
// On a lock family, q is the round's waiter (nil for a TryAcquire): what
// says whether the nodes put it back in the queue (queueKeep: the wait goes
// on) or take it out (queueDrop: the round's error ends the wait; then
// every node is told, also one that did not grant: see famReleaseScript).
func (l *Locker) cleanup(ctx context.Context, k keys, owner string, nodes []int, timeout time.Duration, announce bool, q *queued, what string) error {
	if q != nil && what == queueDrop {
		nodes = l.all
	}
	if len(nodes) == 0 {
		return nil
	}
	del := runDelete
	if announce {
		del = runRelease
	}
	_, err := fanout(l, ctx, context.Background(), nil, nodes, timeout,
		func(ctx context.Context, _ int, c goredis.UniversalClient) (bool, error) {
			if q != nil {
				return runFamRelease(ctx, c, k, owner, announce, q, what)
			}
			return del(ctx, c, k, owner)
		}, nil, nil)
	if err != nil && ctx.Err() != nil {
		return l.life.Why(ctx, nil)
	}
	return nil
}

// releaseOn deletes our lock on node i, waiting at most timeout, on the
// calling goroutine, which must be active.
func (l *Locker) releaseOn(i int, k keys, owner string, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, _ = runDelete(withScripts(ctx, &l.scripts[i]), l.clients[i], k, owner)
}

// maySent reports whether a request that failed with err may have reached
// the node: not when it failed to dial or to get a connection.
func maySent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	return !errors.Is(err, goredis.ErrPoolTimeout) && !errors.Is(err, goredis.ErrClosed) &&
		!errors.Is(err, goredis.ErrPoolExhausted)
}
